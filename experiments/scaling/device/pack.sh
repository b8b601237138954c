#!/bin/bash
# Pack what the Delphi suite needs on a lent accelerator machine that has Python 3.11 and JAX but not this
# project's other dependencies, and no network (the TPU v5e of docs/scaling.md). Writes .tpu/ (git-ignored):
#   site.tar.xz  the pure-Python and small compiled dependencies, copied from this checkout's .venv (x86-64,
#                CPython 3.11, so they run there as they run here); tensorstore, matplotlib, fonttools and pillow
#                come from that machine's own package index instead (run.sh), to stay under the 64 MiB carry
#   out.tar.xz   the suite's cached data steps from PREFIX: the data step's record (not its 29 MB of shards:
#                nothing downstream reads them once the token cache exists), the tokenizer, the token cache,
#                the cloze task, and any finished scaling/ run folders without their checkpoints
#   installed    the installed distributions' digest the packed data steps' keys carry (from their records)
#                (experiments/scaling/site_packages.py): run.sh passes it to the suite there, whose own
#                packages differ, so that it finds these steps instead of building others
#   run.sh, only.py
# Usage: experiments/scaling/device/pack.sh PREFIX          (PREFIX: the suite's output folder on this machine)
set -euo pipefail
PREFIX=${1:?usage: pack.sh PREFIX}
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p .tpu
PKGS="aqt flax etils equinox haliax jaxtyping wadler_lindig cloudpickle filelock fsspec rich markdown_it mdurl
pygments orjson msgpack opt_einsum optax absl safetensors typing_extensions.py psutil threadpoolctl.py tiktoken
tiktoken_ext regex yaml _yaml zstandard six.py dateutil pyparsing cycler tokenizers kiwisolver contourpy"
DISTS="aqtp flax etils equinox haliax jaxtyping wadler_lindig cloudpickle filelock fsspec rich markdown_it_py mdurl
pygments orjson msgpack opt_einsum optax absl_py safetensors typing_extensions psutil threadpoolctl tiktoken regex
PyYAML pyyaml zstandard six python_dateutil pyparsing cycler tokenizers kiwisolver contourpy"
(cd "$SITE" && tar cf - --exclude=__pycache__ $PKGS $(for d in $DISTS; do ls -d "$d"-*.dist-info 2>/dev/null || true; done)) \
  | xz -T2 -6 > .tpu/site.tar.xz
(cd "$PREFIX" && tar cf - --exclude='step-[0-9]*' --exclude='part-*' --exclude='checkpoints' \
  data tokenizers tokenized tasks $(ls -d scaling 2>/dev/null || true)) | xz -T2 -6 > .tpu/out.tar.xz
# the digest the packed data steps were built under (their records), not this venv's now: they can differ
.venv/bin/python - "$PREFIX" > .tpu/installed <<'PY'
import glob, json, sys
found = {json.load(open(f))["config"]["installed"] for f in glob.glob(f"{sys.argv[1]}/data/site-packages-*/.schooner/step.json")}
if len(found) != 1:
    sys.exit(f"pack.sh: {sys.argv[1]}/data holds corpus steps of {len(found)} installed digests ({sorted(found)}); "
             "pack a prefix with one (the data phase's)")
print(found.pop())
PY
cp experiments/scaling/device/run.sh experiments/scaling/device/only.py .tpu/
du -ch .tpu/* | tail -1
echo "then on the lent machine, carrying .tpu: 'PHASE=<sweep|forecast|heldout or none> bash .tpu/run.sh 540'"
echo "(the PHASE that comes next for this prefix: docs/scaling.md, 'Running the suite on a lent accelerator')"
