set -x
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
T0=$(date +%s)
python3 -m benchmarks.bench_decode_attention --heads 16 8 --batch 32 --keys 4096 8192 --page 16 --splits 1 2 3 4 6 8 \
  --cuda-configs 4,3 4,2 8,2 2,8 --out $OUT/attn_1p7b.json > $OUT/attn.log 2>&1
python3 -m benchmarks.bench_decode_attention --heads 32 8 --batch 64 --keys 4096 8192 --page 16 --splits 1 2 3 4 6 8 \
  --cuda-configs 4,3 4,2 8,2 2,8 --out $OUT/attn_8b.json >> $OUT/attn.log 2>&1
echo "attn done $(( $(date +%s) - T0 )) s"
grep -A40 "decode attention on" $OUT/attn.log | grep -v "^{" 
timeout 300 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 32 --prompt-len 7680 --gen-len 512 \
  --presets jetrl_kv --modes attention+logsumexp+cublas --profile-steps 3 --steps 5 --out $OUT/exact_8k.json > $OUT/exact.log 2>&1
echo "exact rc $? $(( $(date +%s) - T0 )) s"
tail -40 $OUT/exact.log
timeout 150 python3 -m pytest -q -s tests/gpu/test_tune_cache_gpu.py > $OUT/tune.log 2>&1
echo "tune rc $? $(( $(date +%s) - T0 )) s"
tail -25 $OUT/tune.log
