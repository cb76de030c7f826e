#!/usr/bin/env bash
# Regenerates protocol/_gen/ from proto/ (usage: gen_protos.sh [OUTPUT_ROOT], default the repo).
# Never edit protocol/_gen/ by hand. The .proto files are mapped under the virtual path
# stratagem/protocol/_gen/ so the generated modules import each other as
# stratagem.protocol._gen.stratagem.v1.* (the installed import path of protocol/_gen/), with no
# sys.path tricks; the output is then moved into protocol/_gen/. The staleness test runs this into
# a temporary root and compares.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="$(mkdir -p "${1:-$repo}" && cd "${1:-$repo}" && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
export PATH="$(dirname "$py"):$PATH"
cd "$repo"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mapfile -t files < <(cd proto && find stratagem -name '*.proto' | sort)
"$py" -m grpc_tools.protoc \
  --proto_path="stratagem/protocol/_gen=proto" \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
  "${files[@]/#/stratagem/protocol/_gen/}"
rm -rf "$root/protocol/_gen/stratagem"
mkdir -p "$root/protocol/_gen"
mv "$out/stratagem/protocol/_gen/stratagem" "$root/protocol/_gen/stratagem"
# Every generated folder is a package.
find "$root/protocol/_gen" -type d -exec sh -c ': > "$0/__init__.py"' {} \;
