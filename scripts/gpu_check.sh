#!/usr/bin/env bash
# One-time check of kernelzoo on one CUDA GPU, in under 10 minutes, as one command:
#
#     bash scripts/gpu_check.sh [OUT_DIR]        # OUT_DIR defaults to $OUT, else results/local/gpu_check
#
# 1. finds a Python whose torch sees a GPU ($PYTHON, .venv/bin/python, python3; else it tries to
#    create .venv-gpu with `pip install torch` and the project, which needs network access);
#    without hydra there, it installs the wheels `make wheels` wrote to .whl/ (carry .whl along);
# 2. correctness on cuda: the fast path against the reference and against the CPU, outputs and
#    gradients, for every Figure 2 map and the delta rule (inline below), then the fast-path
#    tests of tests/test_model.py and tests/test_memory.py with KERNELZOO_TEST_DEVICE=cuda, the
#    pack tests, and a compiled step against an eager one for every registered map (a compiled
#    step that differs is dropped for the eager one at its first step, with a warning: here it
#    fails the check);
# 3. the benchmark on cuda (python -m kernelzoo.bench --device cuda) -> OUT_DIR/bench/;
# 4. figure2 end to end on the GPU under the default launcher: one worker holds the device and
#    trains packs sized by its memory (trainer.pack=auto: as many runs as 80% of it holds at
#    their estimates; compiled: trainer.compile=auto), stopped by its timeout (a rerun resumes:
#    finished runs are skipped) -> OUT_DIR/sweep/; the goal is figure2 in 5 minutes;
# 5. a short table last: the benchmark, figure2's wall time and runs per minute, and each run's
#    agreement with the CPU store results/reference/figure2 (pass or fail at tau = 0.01 alike,
#    and the failure point of each configuration beside the CPU's). Everything is also written
#    to OUT_DIR/gpu_check.log.
#
# Time limits (seconds; override through the environment): TESTS_TIMEOUT 150 (each of four
# steps), BENCH_TIMEOUT 120, SWEEP_TIMEOUT 300; BENCH_ARGS "--quick --budget 0.5".
# DEVICE=cpu runs the same steps on the CPU (a smoke test of this script). Exit code: 0 if the
# correctness checks pass, else 1.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-results/local/gpu_check}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG=$OUT_DIR/gpu_check.log
exec > >(tee "$LOG") 2>&1
TESTS_TIMEOUT=${TESTS_TIMEOUT:-150}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-300}
BENCH_ARGS=${BENCH_ARGS:---quick --budget 0.5}
export DEVICE=${DEVICE:-cuda}
START=$SECONDS
step() { echo; echo "=== [$((SECONDS - START)) s] $*"; }

step "1. python with torch on $DEVICE"
has_cuda() { "$1" -c "import torch, sys, os
sys.exit(0 if os.environ['DEVICE'] == 'cpu' or torch.cuda.is_available() else 1)" 2>/dev/null; }
PY=""
for candidate in "${PYTHON:-}" .venv/bin/python .venv-gpu/bin/python python3 python; do
    if [[ -n "$candidate" ]] && command -v "$candidate" >/dev/null && has_cuda "$candidate"; then
        PY=$(command -v "$candidate"); break
    fi
done
if [[ -z "$PY" ]]; then
    echo "no python with CUDA torch found; creating .venv-gpu (needs network access)"
    export PIP_DEFAULT_TIMEOUT=20
    python3 -m venv .venv-gpu && .venv-gpu/bin/python -m pip install -q --retries 1 torch \
        && .venv-gpu/bin/python -m pip install -q --retries 1 -e ".[test]" \
        && has_cuda .venv-gpu/bin/python && PY=$(pwd)/.venv-gpu/bin/python
fi
if [[ -z "$PY" ]]; then echo "FAIL: no CUDA torch available"; exit 1; fi
if ! "$PY" -c "import hydra" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    # an offline machine with torch: the wheels `make wheels` left in .whl/, beside its packages
    # (kernelzoo itself runs from src/ below, the code of this tree)
    SITE=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
        && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} && echo "installed .whl/ into $SITE"
fi
if ! "$PY" -c "import kernelzoo" 2>/dev/null; then  # src layout: usable without installing
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import hydra, pytest" 2>/dev/null || echo "note: hydra or pytest missing for $PY: the sweep or the test files will fail"
"$PY" -c "import torch, kernelzoo; print('python', __import__('sys').version.split()[0], '| torch',
torch.__version__, '| cuda', torch.version.cuda, '|', torch.cuda.get_device_name(0)
if torch.cuda.is_available() else 'no GPU')" || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used,utilization.gpu --format=csv 2>/dev/null

step "2. correctness on $DEVICE"
STATUS=0
timeout -k 10 "$TESTS_TIMEOUT" "$PY" - <<'EOF' || STATUS=1
"""Fast path on cuda == reference on cuda == fast path on the CPU (outputs and gradients)."""
import os
import torch
from kernelzoo.maps.catalog import build_feature_map
from kernelzoo.core.model import RetrievalModel, retrieval_loss
from kernelzoo.core.reference import reference_forward
from kernelzoo.core.task import RetrievalTask

MAPS = [("softmax", {}), ("elu", {}), ("dpfp", {"nu": 1}), ("dpfp", {"nu": 3}),
        ("favor", {"m": 64, "variant": "hyperbolic"}), ("favor", {"m": 512, "variant": "hyperbolic"})]
CASES = [(n, p, "sum", S, q) for n, p in MAPS for S in (20, 200) for q in ("one", "many")]
CASES += [("dpfp", {"nu": 1}, "delta", S, q) for S in (20, 200) for q in ("one", "many")]
GPU = os.environ["DEVICE"]
failures = 0
for name, params, rule, S, queries in CASES:
    results = {}
    for device, fn in (("cpu", "fast"), (GPU, "fast"), (GPU, "reference")):
        torch.manual_seed(0)
        extra = {"redraw": "never", "seed": 0} if name == "favor" else {}
        phi = build_feature_map(name, d_key=64, **params, **extra)
        model = RetrievalModel(S, phi, rule, "sum" if rule == "delta" else "attention")
        model = model.double().to(device)
        cpu = torch.device("cpu")  # the same data on both devices
        task = RetrievalTask(S, 2 * S if rule == "delta" else S, S, rule == "delta", 0, cpu)
        b = task.train_batch(32) if queries == "one" else task.eval_batch(20, 200)
        forward = model if fn == "fast" else (lambda *a: reference_forward(model, *a))
        y = forward(b.keys.to(device), b.values.to(device), b.query.to(device))
        loss = retrieval_loss(y, b.target.to(device)).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results[device, fn] = [t.detach().cpu() for t in (y, *grads)]
    worst = 0.0
    for other in (("cpu", "fast"), (GPU, "reference")):
        (y, *grads), (y_ref, *grads_ref) = results[GPU, "fast"], results[other]
        worst = max(worst, (y - y_ref).abs().max().item() / y_ref.abs().max().item())
        # gradients relative to the model's largest (b_k's vanishes under softmax)
        scale = max(g.abs().max().item() for g in grads_ref)
        worst = max([worst] + [(g - r).abs().max().item() / scale for g, r in zip(grads, grads_ref)])
    ok = worst < 1e-8
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} {params} {rule} S={S} {queries}: max rel diff {worst:.1e}")
print(f"{len(CASES) - failures}/{len(CASES)} checks on {GPU} passed")
raise SystemExit(1 if failures else 0)
EOF
KERNELZOO_TEST_DEVICE=$DEVICE timeout -k 10 "$TESTS_TIMEOUT" "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/test_model.py tests/test_memory.py || STATUS=1
timeout -k 10 "$TESTS_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider tests/test_pack.py \
    -k "not smoke" || STATUS=1
timeout -k 10 "$TESTS_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider tests/test_pack.py \
    -m slow -k "compiled_and_eager" || STATUS=1

step "3. benchmark on $DEVICE"
# shellcheck disable=SC2086
timeout -k 10 "$BENCH_TIMEOUT" "$PY" -m kernelzoo.bench --device "$DEVICE" $BENCH_ARGS \
    --out "$OUT_DIR/bench" || echo "benchmark stopped (exit $?)"

step "4. figure2 on $DEVICE, packs sized by its memory, stopped after ${SWEEP_TIMEOUT} s"
timeout -k 20 "$SWEEP_TIMEOUT" "$PY" -m kernelzoo.sweep figure2 trainer.device="$DEVICE" \
    logger=none results_dir="$OUT_DIR/sweep"
case $? in
    0) echo "sweep finished" ;;
    124|137) echo "sweep stopped at its timeout, as planned (rerun the same command to resume)" ;;
    *) echo "sweep FAILED (see above)" ;;
esac

step "5. summary"
"$PY" - "$OUT_DIR" <<'EOF'
import csv, json, sys
from collections import Counter
from pathlib import Path
out = Path(sys.argv[1])
benches = sorted((out / "bench").glob("bench*.csv"))
if benches:
    rows = list(csv.DictReader(open(benches[0])))
    print(f"{'case':<11}{'map':<10}{'n_keys':>7}{'baseline ms':>13}{'kernelzoo ms':>14}{'ratio':>8}{'peak MB':>9}")
    for r in rows:
        if r["n_keys"] in ("20", "600") or r["case"].startswith("delta"):
            print(f"{r['case']:<11}{r['feature_map']:<10}{r['n_keys']:>7}{float(r['baseline_ms']):>13.2f}"
                  f"{float(r['kernelzoo_ms']):>14.2f}{float(r['ratio']):>8.1f}{r['kernelzoo_peak_mb'] or '-':>9}")
else:
    print("no benchmark results")
summaries = [json.loads(p.read_text()) for p in (out / "sweep").glob("*/runs/*/summary.json")]
statuses = Counter(s.get("status") for s in summaries)
steps = sum(s.get("steps") or 0 for s in summaries)
secs = sum(s.get("wall_seconds") or 0 for s in summaries)
print(f"sweep: {len(summaries)} of 240 runs finished {dict(statuses)}; {steps} steps")
history = out / "sweep" / "figure2" / "sweep.json"
if history.exists():
    wall = json.loads(history.read_text())["wall_seconds"]
    print(f"figure2: {len(summaries)} of 240 runs in {wall:.0f} s wall, "
          f"{60 * len(summaries) / max(wall, 1):.1f} a minute (goal: 240 in 300 s)")
# agreement with the CPU store: the same run ids, pass or fail at tau alike
cpu = {}
for p in Path("results/reference/figure2/runs").glob("*/summary.json"):
    s = json.loads(p.read_text())
    cpu[s["run_id"]] = s
tau, same, compared = 0.01, 0, 0
for s in summaries:
    c = cpu.get(s["run_id"])
    if c is None or s.get("final_eval_loss") is None or c.get("final_eval_loss") is None:
        continue
    compared += 1
    same += (s["final_eval_loss"] <= tau) == (c["final_eval_loss"] <= tau)
print(f"agreement with the CPU store: {same} of {compared} runs pass or fail at tau alike")
ours, theirs = out / "sweep" / "figure2" / "capacity.csv", Path("results/reference/figure2/capacity.csv")
if ours.exists() and theirs.exists():
    rows = {r["label"]: r for r in csv.DictReader(open(theirs))}
    for r in csv.DictReader(open(ours)):
        ref = rows.get(r["label"], {})
        num = lambda x: f"{float(x):.4g}" if x else "-"  # noqa: E731
        print(f"  {r['label']:<16} failure point {num(r['observed_capacity']):>8} "
              f"(CPU {num(ref.get('observed_capacity'))}, {r['outcome']})")
EOF
echo "log: $LOG; correctness: $([[ $STATUS == 0 ]] && echo PASS || echo FAIL); total $((SECONDS - START)) s"
exit $STATUS
