#!/usr/bin/env bash
# GPU end-to-end through the CLI (docs/gpu_cli_run.md): build a random-init Qwen3-1.7B checkpoint + math jsonl,
# run GRPO BF16 and unified FP8 + FP8 KV with examples/run_grpo.py, print per-phase step times and peak GPU memory.
#
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_cli_run.sh OUT_DIR [STAGE ...]
#
# From the repo root, with python3 holding torch + transformers + triton and /tmp/site the carried wheels
# (pydantic, omegaconf, hydra-core, math-verify, ...). STAGE: check build bf16 fp8 fp8_kv fp8_kv_matched fp8_kv_fast
# side_by_side report (default: check build bf16 fp8_kv report, in order; fp8 = FP8 linears with a BF16 KV cache,
# grpo_math_random_1p7B.yaml; fp8_kv = the FP8+KV recipe as shipped, whose matched_kernels default is auto on a GPU;
# fp8_kv_matched = the same with policy.generation.matched_kernels=auto said; fp8_kv_fast = with it false;
# side_by_side = two variants at the same time, one GPU each: PAIR_VARIANTS (default "bf16 fp8_kv"; e.g.
# "fp8_kv_fast fp8_kv") on PAIR_GPUS (default "0 1", the first variant's GPU first; "1 0" swaps them): both runs
# see the same host, and a second call with the GPUs swapped separates the GPUs from the
# precisions; each run gets half the host's cores; each run's console goes to OUT/<variant>.log only);
# on a box with a per-command time limit that may start each call on a fresh machine, call
# `OUT check build bf16 report`, then `OUT build fp8_kv report` (a finished build in OUT/ckpt is reused). Writes OUT/ckpt (model + data), OUT/logs/<variant>/ (metrics.jsonl, config.yaml,
# gpu_memory.csv), OUT/<variant>.log (console), OUT/summary.json, OUT/phases.png (the median step by phase).
# Environment: STEPS (GRPO steps, default 10), LAYERS (decoder layers of the built model, default the shape's 28),
# NPROC (GPUs: > 1 launches the run with torchrun, one rank per GPU, `cluster.backend=torchrun`; default 1),
# SUFFIX (appended to each variant's log directory name, e.g. _dp2 / _tp2, so layouts do not overwrite each other),
# GPU (nvidia-smi index(es) to sample, default 0 .. NPROC-1), PYTHON (default python3), EXTRA (more overrides for both runs,
# e.g. EXTRA="grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=256"), COPY_TO (a directory that gets,
# on exit even after a failure, the runs' console logs <variant>.log and <variant>/{metrics.jsonl, config.yaml,
# gpu_memory.csv, kernel_picks.jsonl}: small files, e.g. the device box's $OUT; `python3 -m benchmarks.gpu_cli_report
# bf16=COPY_TO/bf16 fp8_kv=COPY_TO/fp8_kv` redraws the table from them in any checkout); a CPU smoke run of the script
# itself: SHAPE=tiny-test DEVICE=cpu with small EXTRA sizes (tests/functional/test_random_checkpoint.py does it).
# RECIPE: the config family (default grpo_math_random_1p7B: <RECIPE>_bf16.yaml, <RECIPE>_fp8_kv.yaml, <RECIPE>.yaml for
# fp8); another shipped family (e.g. RECIPE=grpo_math_8B) also gets what the random-weight one-GPU run needs and
# grpo_math_random_1p7B.yaml sets: no validation or checkpoints, coin-flip rewards (env.coin_flip_rewards: the
# trainer's gradients are not all zero) with every group trained, the byte tokenizer's eos, NPROC GPUs, no plots
# (docs/long_responses.md).
set -euo pipefail

OUT=${1:?usage: bash benchmarks/gpu_cli_run.sh OUT_DIR [check build bf16 fp8 fp8_kv fp8_kv_matched fp8_kv_fast side_by_side report]}
shift
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(check build bf16 fp8_kv report)
VARIANTS=(bf16 fp8 fp8_kv fp8_kv_matched fp8_kv_fast)  # the runs a stage may name
STEPS=${STEPS:-10}
LAYERS=${LAYERS:-}
NPROC=${NPROC:-1}
SUFFIX=${SUFFIX:-}
GPU=${GPU:-$(seq -s, 0 $((NPROC - 1)))}
SHAPE=${SHAPE:-qwen3-1.7b}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
[ "$DEVICE" = cpu ] && EXTRA_ARGS=(cluster.device=cpu cluster.gpus_per_node=0 "${EXTRA_ARGS[@]}")
CKPT=$OUT/ckpt
COPY_TO=${COPY_TO:-}
PAIR_THREADS=""  # cluster.num_cpu_threads of a run side_by_side starts (local to that stage)
RECIPE=${RECIPE:-grpo_math_random_1p7B}
RANDOM_RUN=()
[ "$RECIPE" != grpo_math_random_1p7B ] && RANDOM_RUN=(checkpointing.enabled=false grpo.val_period=0
    grpo.val_at_start=false grpo.drop_zero_advantage_groups=false policy.generation.stop_token_ids=null
    logger.plot_period=null logger.tensorboard_enabled=false env.coin_flip_rewards=true)
[ "$RECIPE" != grpo_math_random_1p7B ] && [ "$NPROC" -eq 1 ] && RANDOM_RUN+=(cluster.gpus_per_node=1)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"

copy_results() {  # the small result files into $COPY_TO (runs on exit)
    [ -n "$COPY_TO" ] || return 0
    local f v
    for v in "${VARIANTS[@]}"; do
        v=$v$SUFFIX
        [ -f "$OUT/$v.log" ] && mkdir -p "$COPY_TO" && cp "$OUT/$v.log" "$COPY_TO/"
        for f in metrics.jsonl config.yaml gpu_memory.csv kernel_picks.jsonl; do
            [ -f "$OUT/logs/$v/$f" ] && mkdir -p "$COPY_TO/$v" && cp "$OUT/logs/$v/$f" "$COPY_TO/$v/"
        done
    done
    return 0
}
trap copy_results EXIT

[ -f examples/run_grpo.py ] || { echo "error: run from the repo root (examples/run_grpo.py not found)" >&2; exit 2; }

stage_check() {
    DEVICE=$DEVICE "$PY" - <<'EOF'
import importlib, sys
need = ["torch", "transformers", "tokenizers", "safetensors", "triton", "numpy", "yaml", "tqdm", "rich",
        "pydantic", "omegaconf", "hydra", "math_verify", "nemo_jetrl"]
missing = []
for name in need:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure is a missing dependency here
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
if missing:
    sys.exit("error: cannot import: " + "; ".join(missing) + " (PYTHONPATH=/tmp/site:$PWD with the carried wheels?)")
import os, torch
if os.environ["DEVICE"] != "cpu" and not torch.cuda.is_available():
    sys.exit("error: torch sees no CUDA device")
where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
print(f"check ok: torch {torch.__version__}, {where}")
EOF
}

stage_build() {
    if [ -f "$CKPT/build_info.json" ]; then  # written last: the build finished
        echo "build: reusing $CKPT (delete it to rebuild)"
        return
    fi
    rm -rf "$CKPT"  # an interrupted build
    local layers=()
    [ -n "$LAYERS" ] && layers=(--layers "$LAYERS")
    "$PY" examples/build_random_checkpoint.py --out "$CKPT" --shape "$SHAPE" --device "$DEVICE" "${layers[@]}" \
        2>&1 | tee "$OUT/build.log"
}

run_variant() {  # $1: bf16 | fp8 | fp8_kv | fp8_kv_matched | fp8_kv_fast
    local variant=$1$SUFFIX log=$OUT/logs/$1$SUFFIX rc=0 smi config=${RECIPE}_$1.yaml own=()
    local launch=("$PY") ranks=()
    if [ "$NPROC" -gt 1 ]; then  # one rank per GPU (docs/cluster.md, torchrun)
        launch=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC")
        ranks=(cluster.backend=torchrun "cluster.gpus_per_node=$NPROC")
    fi
    [ "$1" = fp8 ] && [ -f "examples/configs/$RECIPE.yaml" ] && config=$RECIPE.yaml  # FP8 linears, BF16 KV
    if [ "$1" = fp8_kv_matched ]; then  # the FP8+KV recipe, bitwise on-policy where the self-check passes
        config=${RECIPE}_fp8_kv.yaml
        own=(policy.generation.matched_kernels=auto)
    elif [ "$1" = fp8_kv_fast ]; then  # the FP8+KV recipe on the fast path (its own kernels on each side)
        config=${RECIPE}_fp8_kv.yaml
        own=(policy.generation.matched_kernels=false)
    fi
    rm -rf "$log" && mkdir -p "$log"
    smi=""
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -i "$GPU" -lms 500 \
            > "$log/gpu_memory.csv" 2>/dev/null &
        smi=$!
    fi
    "${launch[@]}" examples/run_grpo.py --config "examples/configs/$config" \
        "policy.model_name=$CKPT/model" \
        "data.dataset_name=$CKPT/data/train.jsonl" \
        "data.val_dataset_name=$CKPT/data/val.jsonl" \
        "logger.log_dir=$log" \
        "grpo.max_num_steps=$STEPS" \
        "${RANDOM_RUN[@]}" "${own[@]}" "${ranks[@]}" ${PAIR_THREADS:+"$PAIR_THREADS"} "${EXTRA_ARGS[@]}" 2>&1 \
        | tee "$OUT/$variant.log" \
        || rc=${PIPESTATUS[0]}
    if [ -n "$smi" ]; then
        kill "$smi" 2>/dev/null || true
        wait "$smi" 2>/dev/null || true
    fi
    [ "$rc" -eq 0 ] || { echo "error: the $variant run failed (rc $rc); see $OUT/$variant.log" >&2; exit "$rc"; }
}

is_variant() { local v; for v in "${VARIANTS[@]}"; do [ "$1" = "$v" ] && return 0; done; return 1; }

stage_side_by_side() {  # two variants at once (PAIR_VARIANTS), one GPU each (PAIR_GPUS)
    local gpus pair pid rc_a=0 rc_b=0
    read -r -a gpus <<< "${PAIR_GPUS:-0 1}"
    read -r -a pair <<< "${PAIR_VARIANTS:-bf16 fp8_kv}"
    if [ ${#gpus[@]} -ne 2 ] || [ "${gpus[0]}" = "${gpus[1]}" ] || [ "$NPROC" -ne 1 ]; then
        echo "error: side_by_side runs one GPU per variant: PAIR_GPUS names two different GPUs (got" \
            "'${PAIR_GPUS:-0 1}') and NPROC is 1 (got $NPROC)" >&2
        exit 2
    fi
    if [ ${#pair[@]} -ne 2 ] || [ "${pair[0]}" = "${pair[1]}" ] || ! is_variant "${pair[0]}" \
        || ! is_variant "${pair[1]}"; then
        echo "error: side_by_side: PAIR_VARIANTS names two different variants of ${VARIANTS[*]}" \
            "(got '${PAIR_VARIANTS:-}')" >&2
        exit 2
    fi
    # each run gets half the host's cores (torch's default is all of them in both: the two processes' thread pools
    # then contend and slow both steps, docs/gpu_cli_run.md); a cluster.num_cpu_threads in EXTRA wins
    local threads=$(( $(nproc) / 2 )) PAIR_THREADS=""  # local: a later stage's run keeps torch's default
    [[ " ${EXTRA_ARGS[*]} " == *" cluster.num_cpu_threads="* ]] || PAIR_THREADS="cluster.num_cpu_threads=$(( threads > 0 ? threads : 1 ))"
    echo "${pair[0]} on GPU ${gpus[0]}, ${pair[1]} on GPU ${gpus[1]}, at the same time (consoles:" \
        "$OUT/${pair[0]}$SUFFIX.log, $OUT/${pair[1]}$SUFFIX.log${PAIR_THREADS:+; $PAIR_THREADS each})"
    (export CUDA_VISIBLE_DEVICES=${gpus[0]}; GPU=${gpus[0]}; run_variant "${pair[0]}" > /dev/null) &
    pid=$!
    (export CUDA_VISIBLE_DEVICES=${gpus[1]}; GPU=${gpus[1]}; run_variant "${pair[1]}" > /dev/null) || rc_b=$?
    wait "$pid" || rc_a=$?
    [ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ] && return 0
    echo "error: side_by_side: ${pair[0]} rc $rc_a, ${pair[1]} rc $rc_b" >&2
    exit 1
}

stage_report() {
    echo
    echo "per-phase GRPO step time (median over steps 2..$STEPS; first step in brackets) and peak GPU memory:"
    local runs=() v
    for v in "${VARIANTS[@]}"; do  # the variants of this layout (SUFFIX) that ran
        [ -f "$OUT/logs/$v$SUFFIX/metrics.jsonl" ] && runs+=("$v$SUFFIX=$OUT/logs/$v$SUFFIX")
    done
    [ ${#runs[@]} -gt 0 ] || { echo "error: no run of layout '$SUFFIX' in $OUT/logs" >&2; exit 1; }
    local baseline=()  # every run's speed-up over BF16 where BF16 ran
    [ -f "$OUT/logs/bf16$SUFFIX/metrics.jsonl" ] && baseline=(--baseline "bf16$SUFFIX")
    "$PY" -m benchmarks.gpu_cli_report "${runs[@]}" "${baseline[@]}" --json "$OUT/summary.json" \
        --phase-plot "$OUT/phases.png"
    echo "summary: $OUT/summary.json"
}

for stage in "${STAGES[@]}"; do
    echo "=== stage $stage ($(date +%H:%M:%S)) ==="
    case $stage in
        check) stage_check ;;
        build) stage_build ;;
        side_by_side) stage_side_by_side ;;
        report) stage_report ;;
        *) is_variant "$stage" || {
               echo "error: unknown stage '$stage' (check build ${VARIANTS[*]} side_by_side report)" >&2
               exit 2
           }
           run_variant "$stage" ;;
    esac
done
