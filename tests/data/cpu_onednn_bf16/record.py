"""Record oneDNN verbose of a small CNN training step under CPU autocast bf16 (M3, issue 38)."""
import sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.conv1 = nn.Conv2d(1, 32, 3, padding=1); s.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        s.fc1 = nn.Linear(64*7*7, 128); s.fc2 = nn.Linear(128, 10)
    def forward(s, x):
        x = F.max_pool2d(F.relu(s.conv1(x)), 2); x = F.max_pool2d(F.relu(s.conv2(x)), 2)
        x = F.relu(s.fc1(x.flatten(1))); return F.log_softmax(s.fc2(x), 1)
m = Net(); opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(16, 1, 28, 28); y = torch.randint(0, 10, (16,))
dtype = {"bf16": torch.bfloat16, "fp32": None}[sys.argv[1]]
for step in range(int(sys.argv[2])):
    print(f"step {step}", flush=True)
    opt.zero_grad()
    if dtype is None:
        loss = F.nll_loss(m(x), y)
    else:
        with torch.autocast("cpu", dtype=dtype):
            loss = F.nll_loss(m(x), y)
    loss.backward(); opt.step()
print("torch", torch.__version__, "onednn", torch.backends.mkldnn.version() if hasattr(torch.backends.mkldnn,'version') else '?', flush=True)
