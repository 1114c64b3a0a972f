#!/usr/bin/env bash
# The README's main job, exercised as a newcomer would: start `kael-server` (no --data: the
# bundled kael-tiny), stream a continuation with curl, call the OpenAI API with the official
# client, and check the answer looks like Python. Assumes the packages are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PORT:-18000}
log=$(mktemp)
kael-server --port "$port" >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "kael-server exited" >&2; exit 1; }
    sleep 0.2
done
curl -sf "http://127.0.0.1:$port/ready" >/dev/null || { cat "$log"; echo "kael-server never became ready" >&2; exit 1; }
echo "--- curl /generate (streamed):"
out=$(curl -sN "http://127.0.0.1:$port/generate" -H 'Content-Type: application/json' \
      -d '{"prompt": "def fibonacci(n):\n", "max_tokens": 64, "temperature": 0, "stream": true}')
printf '%s\n' "${out:0:2000}"
[[ $out == *"data: [DONE]"* ]] || { echo "stream did not end with [DONE]" >&2; exit 1; }
echo "--- OpenAI client /v1/completions:"
PORT=$port python - <<'PY'
import json, os, re, sys

import httpx
import openai

port = os.environ["PORT"]
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
model = client.models.list().data[0].id  # the served name (another is a 404)
text = client.completions.create(model=model, prompt="import os\n", max_tokens=32).choices[0].text
print(repr(text))
plain = httpx.post(f"http://127.0.0.1:{port}/generate",
                   json={"prompt": "class Parser:\n    def ", "max_tokens": 96, "temperature": 0}, timeout=120).json()
print(plain["text"])
python_like = re.search(r"\b(def|self|return|if|import|for|in|None|class)\b", plain["text"])
sys.exit(0 if python_like else "the bundled model's answer does not look like Python")
PY
echo "--- page at / and metrics"
page=$(curl -sf "http://127.0.0.1:$port/")
grep -q "kael playground" <<<"$page"
metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
grep -q 'kael_requests_total{status="ok"}' <<<"$metrics"
echo "smoke test ok"
