#!/usr/bin/env bash
# Regenerates protocol/_gen/ from proto/ (usage: gen_protos.sh [OUTPUT_ROOT], default the repo).
# Never edit protocol/_gen/ by hand. The .proto files are mapped under the virtual path
# protocol/_gen/ so the generated modules import each other as protocol._gen.stratagem.v1.*,
# with no sys.path tricks. The staleness test runs this into a temporary root and compares.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="$(mkdir -p "${1:-$repo}" && cd "${1:-$repo}" && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
export PATH="$(dirname "$py"):$PATH"
cd "$repo"
rm -rf "$root/protocol/_gen/stratagem"
mkdir -p "$root/protocol/_gen"
mapfile -t files < <(cd proto && find stratagem -name '*.proto' | sort)
"$py" -m grpc_tools.protoc \
  --proto_path="protocol/_gen=proto" \
  --python_out="$root" --grpc_python_out="$root" --mypy_out="$root" --mypy_grpc_out="$root" \
  "${files[@]/#/protocol/_gen/}"
# Every generated folder is a package.
find "$root/protocol/_gen" -type d -exec sh -c ': > "$0/__init__.py"' {} \;
