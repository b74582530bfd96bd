#!/usr/bin/env bash
# One lease of a GPU machine: everything we measure or check there, in two parts that each fit a
# 10-minute call.  Logs go to $OUT (or /tmp/gpu_out).  Wheels missing on the machine (ml_collections,
# tfds without TensorFlow, ...) are carried in .whl/ and the Fashion-MNIST IDX files in .fmnist/
# (see BENCHMARKS.md, "How the GPU figures were taken").
#   bash benchmarks/gpu_run.sh a    # GPU test subset, JAX train-step benchmark, PyTorch mirror
#   bash benchmarks/gpu_run.sh b    # search benchmark, the demo comparison (9 methods) on the GPU
#   c / d / e / f: see each section below
#   bash benchmarks/gpu_run.sh race # benchmarks/race.py at its three configs (f32 and bf16) + the loader
#                                   # benchmark, into $OUT/race/; resumable: run it again until it prints "race: done"
#   bash benchmarks/gpu_run.sh scale # benchmarks/index_scale.py: the exact index at 1M and 10M rows beside faiss-cpu
#   bash benchmarks/gpu_run.sh profile # race.py's cifar16 k=1, k=8 and population-8 rows traced (profile_summary.py)
#   bash benchmarks/gpu_run.sh serve # benchmarks/serve.py on the GPU host (16 cores: clients no longer starve the server)
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
"${PYTHON:-python3}" -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" | tee -a "$OUT/env_$1.txt"
case "$1" in
  a)
    timeout 240 python3 -m pytest -q -p no:cacheprovider -x --timeout 200 tests/methods/test_losses.py tests/retrieval/test_evaluate.py \
      tests/methods/test_distillation.py tests/methods/test_regularizers.py tests/augment/test_augment.py tests/models/test_models.py \
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
    timeout 240 python3 -m pytest -q -p no:cacheprovider --timeout 200 tests/methods/test_losses.py tests/retrieval/test_evaluate.py \
      tests/methods/test_distillation.py tests/methods/test_regularizers.py tests/augment/test_augment.py tests/models/test_models.py \
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
    timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 150 tests/retrieval/test_evaluate.py tests/methods/test_losses.py \
      tests/methods/test_regularizers.py 2>&1 | tail -5 | tee "$OUT/tests.txt"
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
case "$1" in
  race)  # our step / k-step / population vs PyTorch eager / torch.compile, one part per process
    # Each part (config x side x rows) writes $R/<part>.json; a part whose JSON exists is skipped, so the
    # same command resumes after a call's time limit.  A call stops starting parts when fewer than
    # MIN_PART_S of its RACE_CALL_S are left; a part that runs out of a full call's time gets a row
    # "timed out after N s" (placeholder) instead of being retried for ever.
    # RACE_DIR keeps the parts between calls (default $OUT/race; under a tool whose $OUT starts empty each
    # call, RACE_DIR=/tmp/race: kept while the machine stays up, and copied to $OUT/race at every exit).
    # RACE_DTYPES=float32,bfloat16 adds the bf16 rows (about twice the time).  RACE_CONFIGS="cifar16" runs
    # one configuration's parts only; RACE_LOADER=0 leaves out the loader benchmark.
    PY=${PYTHON:-python3}
    R=${RACE_DIR:-$OUT/race}; mkdir -p "$R" "$OUT/race"
    [ "$R" -ef "$OUT/race" ] || trap 'cp -r "$R"/. "$OUT/race/"' EXIT
    CALL_S=${RACE_CALL_S:-560}; MIN_PART_S=${MIN_PART_S:-150}; RACE_DTYPES=${RACE_DTYPES:-float32}
    t0=$(date +%s)
    parts=()
    for dt in ${RACE_DTYPES//,/ }; do
      for cfg in ${RACE_CONFIGS:-cifar16 cifar256 rn50_64}; do  # max-autotune last: its autotuning is the longest part
        parts+=("$cfg $dt jax step" "$cfg $dt jax kstep 4" "$cfg $dt jax kstep 8" "$cfg $dt jax population 4"
                "$cfg $dt jax population 8" "$cfg $dt torch eager" "$cfg $dt torch default"
                "$cfg $dt torch reduce-overhead" "$cfg $dt torch max-autotune")
      done
    done
    for part in "${parts[@]}"; do
      read -r cfg dt side rows n <<< "$part"
      f="$R/part_${cfg}_${dt}_${side}_${rows}${n:+_$n}.json"
      [ -f "$f" ] && continue
      left=$(( CALL_S - ($(date +%s) - t0) ))
      if [ "$left" -lt "$MIN_PART_S" ]; then echo "race: chunk ended, run the same command again"; exit 0; fi
      args=(--side "$side" --configs "$cfg" --dtype "$dt" --rows "$rows")
      [ "$rows" = kstep ] && args+=(--ks "$n")
      [ "$rows" = population ] && args+=(--populations "$n")
      echo "== $cfg $dt $side $rows $n ($left s left in this call)"
      timeout --signal=KILL "$left" "$PY" benchmarks/race.py "${args[@]}" --json "$f" 2>&1 \
        | grep --line-buffered -v -E "^[WI][0-9]{4} " | tee -a "$R/race.log"
      if [ ! -f "$f" ] && [ "$left" -ge "$(( CALL_S - 30 ))" ]; then  # it had (nearly) a whole call: give up on it
        "$PY" benchmarks/race.py "${args[@]}" --placeholder "timed out after $left s" --json "$f"
      elif [ ! -f "$f" ]; then
        echo "race: $cfg $dt $side $rows $n did not finish in $left s; run again (it gets a whole call next)"; exit 0
      fi
    done
    if [ "${RACE_LOADER:-1}" = 1 ] && [ -f benchmarks/input_pipeline.py ] && [ ! -f "$R/input_pipeline.json" ] && [ ! -f "$R/input_pipeline.failed" ]; then
      # the batch loader alone (the machine's CPU side), on the data it can find
      ds=product_m
      [ -d /usr/share/datasets/fashion-mnist ] && ds="fashion_mnist_local,$ds"
      [ -f ../shared/data/tiny-imagenet-200-mini.zip ] && ds="tiny_imagenet_zip,$ds"
      left=$(( CALL_S - ($(date +%s) - t0) ))
      if [ "$left" -lt "$MIN_PART_S" ]; then echo "race: chunk ended, run the same command again"; exit 0; fi
      JAX_PLATFORMS=${LOADER_JAX_PLATFORMS:-cuda} timeout --signal=KILL "$left" "$PY" benchmarks/input_pipeline.py \
        --datasets "$ds" --json "$R/input_pipeline.json" > "$R/input_pipeline.md" 2>&1
      rc=$?
      grep -v -E "^[WI][0-9]{4} " "$R/input_pipeline.md" | tail -20
      if [ ! -f "$R/input_pipeline.json" ]; then
        if [ $rc -eq 137 ] && [ "$left" -lt "$(( CALL_S - 30 ))" ]; then echo "race: loader unfinished; run again"; exit 0; fi
        echo "exit $rc after at most $left s" > "$R/input_pipeline.failed"  # not retried; see input_pipeline.md
      fi
    fi
    "$PY" benchmarks/race.py --merge "$R"/part_*.json --json "$R/race.json" | tee "$R/race.md"
    echo "race: done ($R/race.md, $R/race.json, $R/input_pipeline.md)"
    ;;
esac
case "$1" in
  scale)  # serve's exact index on the device at 1M and 10M rows beside faiss-cpu (IndexFlatIP) on the same rows,
          # at the default gallery_block and two larger scan steps (SCALE_SIZES / SCALE_BLOCKS override)
    "${PYTHON:-python3}" benchmarks/index_scale.py --sizes ${SCALE_SIZES:-1000000 10000000} \
      --blocks ${SCALE_BLOCKS:-4096 65536 262144} --json "$OUT/index_scale.json" 2>&1 \
      | grep --line-buffered -v -E "^[WI][0-9]{4} " | tee "$OUT/index_scale.md"
    ;;
esac
case "$1" in
  profile)  # the race's best rows again, each followed by 5 traced calls; the trace read into a table
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    timeout "${PROFILE_S:-200}" "${PYTHON:-python3}" benchmarks/race.py --side jax --configs cifar16 --rows kstep,population \
      --ks 1,8 --populations 8 --profile "$OUT/prof" --json "$OUT/prof_rows.json" 2>&1 | grep -v -E "^[WI][0-9]{4} " | tail -8
    "${PYTHON:-python3}" benchmarks/profile_summary.py "$OUT"/prof/* --json "$OUT/prof_summary.json" > "$OUT/prof.md"
    rm -f "$OUT"/prof/*/plugins/profile/*/*.xplane.pb "$OUT"/prof/*/plugins/profile/*/*.trace.json.gz  # perfetto JSON kept
    ;;
esac
case "$1" in
  serve)  # serve, the baseline and one search process per query, on this host (processes share the GPU: no preallocation)
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    timeout "${SERVE_S:-330}" "${PYTHON:-python3}" benchmarks/serve.py ${SERVE_ARGS:-} --out "$OUT/serve_gpu.json" 2>&1 \
      | grep --line-buffered -v -E "^[WI][0-9]{4} " > "$OUT/serve_gpu.txt"; tail -40 "$OUT/serve_gpu.txt"
    ;;
esac
case "$1" in
  stages)  # serve's batch stages in one process beside the baseline's (no HTTP), traced; the race rows not yet run
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    timeout 150 "${PYTHON:-python3}" benchmarks/serve_stages.py --profile "$OUT/prof_serve" --json "$OUT/stages.json" 2>&1 \
      | grep -E "^batch" | tee "$OUT/stages.txt"
    "${PYTHON:-python3}" benchmarks/profile_summary.py "$OUT"/prof_serve/* --top 25 > "$OUT/prof_serve.md"
    rm -rf "$OUT/prof_serve"
    R="$OUT/race"; mkdir -p "$R"
    timeout 120 "${PYTHON:-python3}" benchmarks/race.py --side jax --configs cifar16,cifar256 --dtype bfloat16 --rows step,population \
      --populations 8 --json "$R/part_bf16_jax.json" 2>&1 | grep -v -E "^[WI][0-9]{4} " | tail -6
    timeout 60 "${PYTHON:-python3}" benchmarks/race.py --side jax --configs cifar256 --rows step --json "$R/part_cifar256_f32_jax.json" 2>&1 \
      | grep -v -E "^[WI][0-9]{4} " | tail -3
    timeout 60 "${PYTHON:-python3}" benchmarks/race.py --side torch --configs cifar256 --rows eager --json "$R/part_cifar256_f32_torch.json" 2>&1 \
      | grep -v -E "^[WI][0-9]{4} " | tail -3
    ;;
esac
