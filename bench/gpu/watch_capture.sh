#!/usr/bin/env bash
# Usage: bench/gpu/watch_capture.sh OUTDIR BINDIR (from the repository root; needs tmux and torch).
# tmux capture of `memprof watch` beside a small real trainer (GPU view, then agent view).
R=$1; B=$2
cat > /tmp/wtrain.py <<'PY'
import torch, time
xs = []
for i in range(60):
    xs.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    y = torch.randn(4096, 4096, device="cuda") @ torch.randn(4096, 4096, device="cuda")
    time.sleep(0.3)
PY
tmux new-session -d -s w -x 150 -y 45 "$B/memprof watch --agent-path $PWD/agent/python -- python3 /tmp/wtrain.py; sleep 30"
sleep 14; tmux capture-pane -p -t w > $R/watch-gpus.txt
tmux send-keys -t w a; sleep 2; tmux capture-pane -p -t w > $R/watch-agent.txt
tmux send-keys -t w q; sleep 2; tmux kill-session -t w 2>/dev/null; true
