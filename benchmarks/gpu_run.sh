#!/usr/bin/env bash
# One lease of a GPU machine: everything we measure or check there, in two parts that each fit a
# 10-minute call.  Logs go to $OUT (or /tmp/gpu_out).  Wheels missing on the machine (ml_collections,
# tfds without TensorFlow, ...) are carried in .whl/ and the Fashion-MNIST IDX files in .fmnist/
# (see BENCHMARKS.md, "How the GPU figures were taken").
#   bash benchmarks/gpu_run.sh a    # GPU test subset, JAX train-step benchmark, PyTorch mirror
#   bash benchmarks/gpu_run.sh b    # search benchmark, the demo comparison (9 methods) on the GPU
#   c / d / e / f: see each section below
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env_$1.txt"
python3 -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" | tee -a "$OUT/env_$1.txt"
case "$1" in
  a)
    timeout 240 python3 -m pytest -q -p no:cacheprovider -x --timeout 200 tests/test_losses.py tests/test_evaluate.py \
      tests/test_distillation.py tests/test_regularizers.py tests/test_augment.py tests/test_models.py \
      2>&1 | tail -25 | tee "$OUT/tests.txt"
    python3 benchmarks/train_step.py 2>&1 | tee "$OUT/train_step.txt"
    python3 benchmarks/train_step_torch.py 2>&1 | tee "$OUT/train_step_torch.txt"
    ;;
  b)
    python3 benchmarks/search.py --precisions highest,default --disk /tmp 2>&1 | tee "$OUT/search.txt"
    start=$(date +%s)
    python3 -m cvs_jax.compare --config configs/fashion_mnist_general.py --workdir /tmp/cmp_gpu \
      --methods finetune,joint,cvs,bct,lwf,mmd,ewc,rwalk,rainbow --seeds 0 \
      --config.data.manual_dir="$PWD/.fmnist" --config.data.data_dir=/tmp/tfds 2>&1 | tail -40 | tee "$OUT/compare.txt"
    echo "compare wall s: $(( $(date +%s) - start ))" | tee -a "$OUT/compare.txt"
    cp /tmp/cmp_gpu/*.md /tmp/cmp_gpu/*.csv "$OUT/" 2>/dev/null
    ;;
esac
case "$1" in
  c)  # after the loss-precision fix: the GPU test subset again, and the methods the first comparison did not reach
    timeout 240 python3 -m pytest -q -p no:cacheprovider --timeout 200 tests/test_losses.py tests/test_evaluate.py \
      tests/test_distillation.py tests/test_regularizers.py tests/test_augment.py tests/test_models.py \
      2>&1 | tail -25 | tee "$OUT/tests.txt"
    python3 -m cvs_jax.compare --config configs/fashion_mnist_general.py --workdir /tmp/cmp_gpu \
      --methods finetune,joint,cvs,rwalk,rainbow,ewc --seeds 0 \
      --config.data.manual_dir="$PWD/.fmnist" --config.data.data_dir=/tmp/tfds 2>&1 \
      | grep -E "importance|AR|error|session . test|^\| " | tee "$OUT/compare.txt"
    cp /tmp/cmp_gpu/*.md "$OUT/" 2>/dev/null
    ;;
esac
case "$1" in
  d)  # determinism: two identical runs with and without config.deterministic; its cost on the step
    timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 150 tests/test_evaluate.py tests/test_losses.py \
      tests/test_regularizers.py 2>&1 | tail -5 | tee "$OUT/tests.txt"
    for det in False True; do
      for rep in 1 2; do
        python3 -m cvs_jax.main --config configs/fashion_mnist_general.py --workdir /tmp/det_${det}_$rep \
          --config.method=cvs --config.data.num_sessions=2 --config.deterministic=$det \
          --config.data.manual_dir="$PWD/.fmnist" --config.data.data_dir=/tmp/tfds > /tmp/det_${det}_$rep.log 2>&1 || tail -5 /tmp/det_${det}_$rep.log
      done
      python3 - "$det" <<'PY' | tee -a "$OUT/determinism.txt"
import json, sys
det = sys.argv[1]
def load(r):
    res = json.load(open(f"/tmp/det_{det}_{r}/results.json"))
    keep = [{k: v for k, v in p.items() if k != "seconds"} for p in res["per_session"]]
    rows = [json.loads(l) for l in open(f"/tmp/det_{det}_{r}/metrics.jsonl")]
    losses = [{k: v for k, v in m.items() if k.startswith("L_") or k in ("loss", "step", "val_recall1")} for m in rows]
    return keep, losses
(ra, la), (rb, lb) = load(1), load(2)
print(f"deterministic={det}: recalls identical {ra == rb}; logged losses identical {la == lb} ({len(la)} lines); "
      f"session-2 R@1 {ra[1]['recall']['1']:.6f} vs {rb[1]['recall']['1']:.6f}; last loss {la[-1].get('loss')} vs {lb[-1].get('loss')}")
PY
    done
    python3 benchmarks/train_step.py --batches 16,256 --dtypes float32,bfloat16 2>&1 | grep -E "^\| " | tee "$OUT/step_nondet.txt"
    XLA_FLAGS=--xla_gpu_deterministic_ops=true python3 benchmarks/train_step.py --batches 16,256 --dtypes float32,bfloat16 \
      2>&1 | grep -E "^\| " | tee "$OUT/step_det.txt"
    ;;
  e)  # the nine-method demo comparison on the GPU (current code)
    start=$(date +%s)
    python3 -m cvs_jax.compare --config configs/fashion_mnist_general.py --workdir /tmp/cmp_gpu \
      --methods finetune,joint,cvs,bct,lwf,mmd,ewc,rwalk,rainbow --seeds 0 \
      --config.data.manual_dir="$PWD/.fmnist" --config.data.data_dir=/tmp/tfds 2>&1 \
      | grep -E "importance|error|^\| " | tee "$OUT/compare.txt"
    echo "compare wall s: $(( $(date +%s) - start ))" | tee -a "$OUT/compare.txt"
    cp /tmp/cmp_gpu/comparison.md /tmp/cmp_gpu/comparison.csv "$OUT/" 2>/dev/null
    ;;
esac
case "$1" in
  f)  # the fine-grained recipe's step: ResNet-50 (frozen BN), RandomResizedCrop 224 on device; PyTorch mirror
    python3 benchmarks/train_step.py --recipe finegrained --batches 32,64 --steps 30 2>&1 | grep -v "^W1123" | tee "$OUT/step_finegrained.txt"
    python3 benchmarks/train_step_torch.py --recipe finegrained --batches 32,64 --steps 30 2>&1 | tee "$OUT/step_finegrained_torch.txt"
    ;;
esac
