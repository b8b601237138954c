#!/bin/bash
# On the lent machine (see pack.sh; its pip index file:///opt/pypi/simple is that machine's: elsewhere install
# tensorstore, matplotlib, fonttools and pillow yourself and edit that line): set up once per bundle, then run
# the Delphi suite (no step names) or only the named steps (only.py) for at most T seconds, and put the run
# folders (no checkpoints) and the log in $OUT.
# The runner resumes cached steps, so a warm machine's next call goes on where this one stopped; a run cut off
# by the time limit resumes from its last checkpoint. Environment: BUDGETS (the fitted list), PHASE
# (SCHOONER_DELPHI_PHASE), CHECKPOINT_EVERY (steps, default 1000), CONC (steps at a time: on the v5e 30 tiny
# runs at once in one process ran at 10k tokens/s each, 3 at 73k, 1 at 125k).
T=${1:-520}; shift
export PYTHONUNBUFFERED=1
W=/tmp/w; mkdir -p $W
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"   # the lending tool sets $OUT (what comes back); elsewhere ./out
t0=$(date +%s)
# set up again when the bundle changed (a new pack.sh), not only on a fresh machine
stamp=$(cat .tpu/site.tar.xz .tpu/out.tar.xz | md5sum | cut -c1-16)
if [ "$(cat $W/setup.done 2>/dev/null)" != "$stamp" ]; then
  rm -rf $W/site $W/prefix $W/big
  mkdir -p $W/site $W/prefix
  tar xJf .tpu/site.tar.xz -C $W/site || exit 1
  tar xJf .tpu/out.tar.xz -C $W/prefix || exit 1
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: --no-deps --no-compile \
    --index-url file:///opt/pypi/simple --target $W/big tensorstore matplotlib fonttools pillow || exit 1
  echo "$stamp" > $W/setup.done
fi
echo "setup $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/lib/cluster/src:$PWD/lib/data/src:$PWD/lib/tokenize/src:$PWD/lib/model/src:$PWD/lib/train/src:$PWD/lib/eval/src:$W/site:$W/big
export JAX_COMPILATION_CACHE_DIR=$W/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
# a checkpoint every 1000 steps (runtime-only: no step key changes), so a run cut off by T resumes next call
export SCHOONER_DELPHI_CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-1000}
# the data steps were built on the packing machine, whose installed distributions their keys name
SCHOONER_DELPHI_INSTALLED=$(cat .tpu/installed) || exit 1; export SCHOONER_DELPHI_INSTALLED
export SCHOONER_PREFIX=$W/prefix SCHOONER_DELPHI_BUDGETS=${BUDGETS:-1e11,3e11,1e12,3e12,1e13} COLUMNS=160 MPLBACKEND=Agg
[ -n "$PHASE" ] && export SCHOONER_DELPHI_PHASE=$PHASE
if [ $# -gt 0 ]; then entry=".tpu/only.py $*"; else entry="experiments/scaling/delphi_suite.py --max-concurrent ${CONC:-3}"; fi
timeout --signal=INT --kill-after=10 $T python3 $entry > $W/suite.log 2>&1
echo "rc=$? after $(( $(date +%s) - t0 )) s"
grep -v "tok/s" $W/suite.log | tail -40
cd $W/prefix && tar czf "$OUT"/results.tgz --exclude='step-[0-9]*' --exclude='checkpoints' scaling experiments
cp $W/suite.log "$OUT"/
