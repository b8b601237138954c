#!/bin/bash
# Pack what the Delphi suite needs on a lent accelerator machine that has Python 3.11 and JAX but not this
# project's other dependencies, and no network (the TPU v5e of docs/scaling.md). Writes .tpu/ (git-ignored):
#   site.tar.xz  the pure-Python and small compiled dependencies, copied from this checkout's .venv (x86-64,
#                CPython 3.11, so they run there as they run here); tensorstore, matplotlib, fonttools and pillow
#                come from that machine's own package index instead (run.sh), to stay under the 64 MiB carry
#   out.tar.xz   the suite's cached data steps from PREFIX: the data step's record (not its 29 MB of shards:
#                nothing downstream reads them once the token cache exists), the tokenizer, the token cache,
#                the cloze task, and any finished scaling/ run folders without their checkpoints
#   installed    this machine's installed distributions' digest, which the data steps' keys carry
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
.venv/bin/python -c 'from experiments.scaling.site_packages import current_installed; print(current_installed())' \
  > .tpu/installed
cp experiments/scaling/device/run.sh experiments/scaling/device/only.py .tpu/
du -ch .tpu/* | tail -1
echo "then on the lent machine, carrying .tpu: 'PHASE=<sweep|forecast|heldout or none> bash .tpu/run.sh 540'"
echo "(the PHASE that comes next for this prefix: docs/scaling.md, 'Running the suite on a lent accelerator')"
