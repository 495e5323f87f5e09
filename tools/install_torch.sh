#!/usr/bin/env bash
# Install the CPU build of the torch that a requirements file pins, before the rest of the main stack, so no
# resolver picks the CUDA build (PyPI's Linux torch: ~900 MB plus ~3 GB of nvidia-* wheels and triton).
#   tools/install_torch.sh <venv's python> <requirements file with torch==X>
# The pinned version already installed: nothing to do. PyTorch's CPU index answers a short probe: from there.
# Otherwise one line says so, and pip's configured sources (find-links, your indexes) are used only when what
# they offer is a CPU build (pip's dry run reads the wheel's metadata: no nvidia-* requirement, no +cu tag);
# a CUDA build stops the install (exit 2) with what to do. HPL_TORCH_INDEX overrides the index's address.
set -euo pipefail

python=$1
requirements=$2
index=${HPL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
probe_seconds=5

pin=$(sed -n 's/^torch==\([^ #;]*\).*/\1/p' "$requirements")
if [[ -z "$pin" ]]; then
  echo "error: $requirements pins no torch==<version>" >&2
  exit 2
fi
installed=$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [[ "${installed%%+*}" == "$pin" ]]; then
  echo "torch $installed is installed already"
  exit 0
fi

# Prints why the index cannot be reached (one line), or nothing when it answers within the probe's time.
unreachable=$("$python" - "$index/torch/" "$probe_seconds" <<'PY'
import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).close()
except Exception as exc:  # any failure means: not usable now
    print(getattr(exc, "reason", exc))
PY
)
sources=(--index-url "$index")
if [[ -n "$unreachable" ]]; then
  echo "note: PyTorch's CPU index $index is unreachable ($unreachable); falling back to pip's configured" \
    "sources (find-links, indexes) for torch $pin, accepted only if they hold a CPU build"
  sources=()
fi

# What pip would install, from its metadata (PyPI serves it apart, so a CUDA wheel is never downloaded here).
verdict=$("$python" -m pip install --dry-run --quiet --no-deps --ignore-installed --report - \
  "${sources[@]}" "torch==$pin" | "$python" -c '
import json
import sys

(torch,) = [item for item in json.load(sys.stdin)["install"] if item["metadata"]["name"] == "torch"]
meta = torch["metadata"]
cuda = "+cu" in meta["version"] or any(req.lower().startswith("nvidia-") for req in meta.get("requires_dist", []))
print("cuda" if cuda else "cpu", meta["version"], torch["download_info"]["url"])
')
read -r build version url <<<"$verdict"
if [[ "$build" == cuda ]]; then
  echo "error: the only torch $pin that pip finds here is a CUDA build ($url); nothing was installed:" \
    "download the CPU wheel for this Python from $index/torch/ into a folder and rerun with" \
    "PIP_FIND_LINKS=<that folder>, or install a torch $pin of your choice into the venv first" \
    "(this CUDA build, several GB: $python -m pip install torch==$pin)" >&2
  exit 2
fi
echo "torch $version (CPU build) from $url"
"$python" -m pip install --progress-bar off "${sources[@]}" "torch==$pin"
