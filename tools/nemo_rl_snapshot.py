#!/usr/bin/env python
"""Regenerate nemo_jetrl/config/nemo_rl_defined_keys.txt: the dotted config keys NeMo-RL defines for GRPO.

    python tools/nemo_rl_snapshot.py /path/to/NeMo-RL-checkout [--commit SHA] [--check]

Two sources, both read as text (nothing of NeMo-RL is imported or copied):
- its config types, with `ast`: the TypedDicts and pydantic models reachable from `nemo_rl/algorithms/grpo.py`'s
  `MasterConfig`, each class with its bases' fields and with its subclasses' (a `GenerationConfig` key may be
  `VllmConfig`'s `vllm_cfg`). A field typed as an open mapping (`dict[str, Any]`, `Any`) is written `key.*`: any key
  below it is NeMo-RL's. `env:` is open in NeMo-RL; its sections take the types named in ENV_SECTIONS;
- the keys its own GRPO / DAPO example configs set (`examples/configs/**/{grpo,dapo}*.yaml`): NeMo-RL reads some
  keys with `.get()` that no type declares (`vllm_cfg.use_deep_gemm`, `megatron_cfg.moe_router_dtype`, ...).
`--check` exits 1 when the committed file differs from what the snapshot gives.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import yaml

FACTS = Path(__file__).resolve().parents[1] / "nemo_jetrl" / "config" / "nemo_rl_defined_keys.txt"
ROOT_MODULE, ROOT_CLASS = "nemo_rl.algorithms.grpo", "MasterConfig"
# env.<name>: the section of each environment of NeMo-RL's ENV_REGISTRY whose config type is a class
ENV_SECTIONS = {
    "math": ("nemo_rl.environments.math_environment", "MathEnvConfig"),
    "dapo": ("nemo_rl.environments.math_environment", "MathEnvConfig"),
    "code": ("nemo_rl.environments.code_environment", "CodeEnvConfig"),
    "code_jaccard": ("nemo_rl.environments.code_jaccard_environment", "CodeJaccardEnvConfig"),
    "reward_model": ("nemo_rl.environments.reward_model_environment", "RewardModelEnvironmentConfig"),
    "vlm": ("nemo_rl.environments.vlm_environment", "VLMEnvConfig"),
    "nemo_gym": ("nemo_rl.environments.nemo_gym", "NemoGymConfig"),
}
CONFIG_BASES = {"TypedDict", "BaseModel"}
OPEN = {"dict", "Dict", "Mapping", "MutableMapping", "Any", "DictConfig"}
WRAPPERS = {"NotRequired", "Required", "Optional", "Annotated", "Union", "ReadOnly"}


class Module:
    """One module's classes, `from x import y` names (local name -> (module, name)) and module-level type aliases."""

    def __init__(self, name: str):
        self.name = name
        self.classes: dict[str, ast.ClassDef] = {}
        self.imports: dict[str, tuple[str, str]] = {}
        self.aliases: dict[str, ast.expr] = {}


def read_modules(snapshot: Path) -> dict[str, Module]:
    modules = {}
    for path in sorted((snapshot / "nemo_rl").rglob("*.py")):
        parts = path.relative_to(snapshot).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        module = Module(name)
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if isinstance(node, ast.ClassDef):
                module.classes[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for item in node.names:
                    module.imports[item.asname or item.name] = (node.module, item.name)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                module.aliases[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                module.aliases[node.target.id] = node.value
        modules[name] = module
    return modules


class Snapshot:
    """Config classes of a NeMo-RL tree, resolved by the imports of the module that names them."""

    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.subclasses: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for module in modules.values():
            for cls in module.classes.values():
                for base in cls.bases:
                    ref = self.resolve(module.name, _name_of(base))
                    if ref is not None:
                        self.subclasses.setdefault(ref, []).append((module.name, cls.name))

    def resolve(self, module: str, name: str | None, depth: int = 0) -> tuple[str, str] | None:
        """(module, class) of `name` as seen from `module`, following `from x import y` re-exports."""
        mod = self.modules.get(module)
        if name is None or mod is None or depth > 8:
            return None
        if name in mod.classes:
            return module, name
        if name in mod.imports:
            return self.resolve(*mod.imports[name], depth + 1)
        return None

    def is_config(self, ref: tuple[str, str], depth: int = 0) -> bool:
        cls = self.modules[ref[0]].classes[ref[1]]
        for base in cls.bases:
            name = _name_of(base)
            if name in CONFIG_BASES:
                return True
            parent = self.resolve(ref[0], name)
            if parent is not None and depth < 8 and self.is_config(parent, depth + 1):
                return True
        return False

    def fields(self, ref: tuple[str, str], seen: frozenset = frozenset()) -> dict[str, tuple[str, ast.expr]]:
        """field -> (module naming its type, annotation): the class's own fields, its bases' and subclasses'."""
        if ref in seen:
            return {}
        seen = seen | {ref}
        module, cls = ref[0], self.modules[ref[0]].classes[ref[1]]
        out: dict[str, tuple[str, ast.expr]] = {}
        for base in cls.bases:
            parent = self.resolve(module, _name_of(base))
            if parent is not None:
                out.update(self.fields(parent, seen))
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.target.id != "model_config" and _name_of(node.annotation) != "ClassVar":
                    out[node.target.id] = (module, node.annotation)
        for sub in self.subclasses.get(ref, []):
            for key, value in self.fields(sub, seen).items():
                out.setdefault(key, value)
        return out

    def type_of(self, module: str, ann: ast.expr, depth: int = 0) -> tuple[list[tuple[str, str]], bool]:
        """(config classes the annotation may hold, whether it may be an open mapping)."""
        if depth > 12:
            return [], False
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a quoted forward reference
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return [], False
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            return _join(self.type_of(module, ann.left, depth + 1), self.type_of(module, ann.right, depth + 1))
        if isinstance(ann, ast.Subscript):
            head = _name_of(ann.value)
            args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if head in WRAPPERS:
                args = args[:1] if head == "Annotated" else args
                result: tuple[list, bool] = ([], False)
                for arg in args:
                    result = _join(result, self.type_of(module, arg, depth + 1))
                return result
            return [], head in OPEN  # list[...] / tuple[...] hold no keys; dict[...] is open
        name = _name_of(ann)
        if name in OPEN:
            return [], True
        ref = self.resolve(module, name)
        if ref is not None:
            return ([ref], False) if self.is_config(ref) else ([], False)
        alias = self.modules[module].aliases.get(name or "")
        if alias is not None:
            return self.type_of(module, alias, depth + 1)
        if name and module in self.modules:
            imported = self.modules[module].imports.get(name)
            if imported and imported[0] in self.modules:
                alias = self.modules[imported[0]].aliases.get(imported[1])
                if alias is not None:
                    return self.type_of(imported[0], alias, depth + 1)
        return [], False

    def keys(self, ref: tuple[str, str], prefix: str, out: set[str], stack: tuple = ()) -> None:
        if ref in stack:
            return
        for name, (module, ann) in self.fields(ref).items():
            key = f"{prefix}{name}"
            out.add(key)
            classes, open_mapping = self.type_of(module, ann)
            if open_mapping:
                out.add(f"{key}.*")
            for cls in classes:
                self.keys(cls, key + ".", out, stack + (ref,))


def _name_of(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name_of(node.value)
    return None


def _join(a: tuple[list, bool], b: tuple[list, bool]) -> tuple[list, bool]:
    return a[0] + [r for r in b[0] if r not in a[0]], a[1] or b[1]


def defined_keys(snapshot: Path) -> list[str]:
    tree = Snapshot(read_modules(snapshot))
    out: set[str] = set()
    tree.keys((ROOT_MODULE, ROOT_CLASS), "", out)
    for section, ref in ENV_SECTIONS.items():
        if ref[1] in getattr(tree.modules.get(ref[0]), "classes", {}):
            out.add(f"env.{section}")
            tree.keys(ref, f"env.{section}.", out)
    return sorted(out)


def example_keys(snapshot: Path) -> set[str]:
    """Every dotted key (mappings and leaves) that the snapshot's GRPO / DAPO example configs write."""
    out: set[str] = set()
    for path in sorted((snapshot / "examples" / "configs").rglob("*.yaml")):
        if re.match(r"(grpo|dapo)", path.name):
            data = yaml.safe_load(path.read_text()) or {}
            _walk(data, "", out)
    return out


def _walk(data: dict, prefix: str, out: set[str]) -> None:
    for key, value in data.items():
        if key in ("defaults", "_override_") and not prefix:
            continue
        if key == "_override_":
            continue
        out.add(f"{prefix}{key}")
        if isinstance(value, dict):
            _walk(value, f"{prefix}{key}.", out)


def render(keys: list[str], commit: str) -> str:
    header = (
        f"# The config keys NeMo-RL defines (NVIDIA-NeMo/RL at {commit}): its GRPO MasterConfig's TypedDicts and\n"
        "# pydantic models, and the keys its GRPO / DAPO example configs set. Written by tools/nemo_rl_snapshot.py\n"
        "# (regenerate; do not edit). `key.*`: an open mapping (dict[str, Any]); every key below it is NeMo-RL's.\n"
    )
    return header + "".join(f"{key}\n" for key in keys)


def snapshot_commit(snapshot: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(snapshot), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path, help="a NeMo-RL checkout (holds nemo_rl/)")
    parser.add_argument("--commit", help="the snapshot's commit (default: git rev-parse HEAD in the snapshot)")
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args(argv)
    if not (args.snapshot / "nemo_rl" / "algorithms" / "grpo.py").is_file():
        parser.error(f"{args.snapshot} holds no nemo_rl/algorithms/grpo.py")
    commit = args.commit or snapshot_commit(args.snapshot)
    if commit is None:
        parser.error("the snapshot is not a git checkout: pass --commit SHA")
    text = render(sorted(set(defined_keys(args.snapshot)) | example_keys(args.snapshot)), commit)
    if args.check:
        same = FACTS.is_file() and FACTS.read_text() == text
        print(f"{FACTS}: {'up to date' if same else 'differs from the snapshot'}")
        return 0 if same else 1
    FACTS.write_text(text)
    print(f"wrote {FACTS} ({text.count(chr(10)) - 3} keys, NeMo-RL {commit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
