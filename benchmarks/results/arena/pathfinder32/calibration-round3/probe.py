"""Pathfinder-32 calibration, round 3 (exploratory, validation split only): does any host leave chance quickly?

A standalone probe, not the arena's host: a small CNN (with or without BatchNorm) or a 2-block pre-LN transformer
(d = 64, 2 heads, optional conv stem, mean or mean+max pooling) trained with AdamW and OneCycle on the generated data
of round 2a, printing the train loss and accuracy of the last 100 steps and the validation accuracy every 100 steps.
Commands and results: README.md next to this file.
"""

import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[5]))
from subquad.attention import build_attention
from subquad.data.lra.pathfinder import PathfinderDataset

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--host", default="cnn")
p.add_argument("--attention", default="softmax")
p.add_argument("--steps", type=int, default=1200)
p.add_argument("--bs", type=int, default=16)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--dim", type=int, default=64)
p.add_argument("--depth", type=int, default=2)
p.add_argument("--stem", type=int, default=0)
p.add_argument("--bn", type=int, default=0)
p.add_argument("--pool", default="mean")
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
torch.manual_seed(a.seed)
tr = PathfinderDataset(a.data, "train")
va = PathfinderDataset(a.data, "val", limit=1000)
X = torch.tensor(tr.pixels, dtype=torch.float32).view(-1, 1, 32, 32) / 255
Y = torch.tensor(tr.labels)
Xv = torch.tensor(va.pixels, dtype=torch.float32).view(-1, 1, 32, 32) / 255
Yv = torch.tensor(va.labels)


class CNN(nn.Module):
    def __init__(s, c=32):
        super().__init__()
        s.f = nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(c, c, 3, padding=1),
            nn.GELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c, c, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(c, c, 3, padding=1),
            nn.GELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c, c, 3, padding=1),
            nn.GELU(),
        )
        s.h = nn.Linear(c, 2)

    def forward(s, x):
        return s.h(s.f(x).mean((2, 3)))


class Blk(nn.Module):
    def __init__(s, d, att):
        super().__init__()
        s.n1 = nn.LayerNorm(d)
        s.n2 = nn.LayerNorm(d)
        s.a = build_attention(att, d, 2, input_size=(32, 32))
        s.m = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(s, x):
        x = x + s.a(s.n1(x), (32, 32))
        return x + s.m(s.n2(x))


class TF(nn.Module):
    def __init__(s, d, depth, att, stem):
        super().__init__()
        if stem and a.bn:
            L = []
            for i in range(stem):
                L += [nn.Conv2d(1 if i == 0 else d, d, 3, padding=1), nn.BatchNorm2d(d), nn.ReLU()]
            s.e = nn.Sequential(*L)
        elif stem:
            s.e = nn.Sequential(
                nn.Conv2d(1, d, 3, padding=1),
                nn.GELU(),
                *[m for _ in range(stem - 1) for m in (nn.Conv2d(d, d, 3, padding=1), nn.GELU())],
            )
        else:
            s.e = nn.Conv2d(1, d, 1)
        s.pos = nn.Parameter(torch.randn(1, 1024, d) * 0.02)
        s.b = nn.ModuleList([Blk(d, att) for _ in range(depth)])
        s.n = nn.LayerNorm(d)
        s.h = nn.Sequential(nn.Linear(2 * d if a.pool == "meanmax" else d, 2 * d), nn.ReLU(), nn.Linear(2 * d, 2))

    def forward(s, x):
        x = s.e(x).flatten(2).transpose(1, 2) + s.pos
        for b in s.b:
            x = b(x)
        x = s.n(x)
        return s.h(torch.cat([x.mean(1), x.amax(1)], 1) if a.pool == "meanmax" else x.mean(1))


class BNCNN(nn.Module):
    def __init__(s, c=48, n=8):
        super().__init__()
        L = [nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()]
        for i in range(n - 1):
            L += [nn.Conv2d(c, c, 3, padding=1 + (i % 3), dilation=1 + (i % 3)), nn.BatchNorm2d(c), nn.ReLU()]
        s.f = nn.Sequential(*L)
        s.h = nn.Linear(2 * c, 2)

    def forward(s, x):
        f = s.f(x)
        return s.h(torch.cat([f.mean((2, 3)), f.amax((2, 3))], 1))


m = BNCNN() if a.host == "bncnn" else CNN() if a.host == "cnn" else TF(a.dim, a.depth, a.attention, a.stem)
opt = torch.optim.AdamW(m.parameters(), lr=a.lr, weight_decay=0.0)
sch = torch.optim.lr_scheduler.OneCycleLR(opt, a.lr, total_steps=a.steps, pct_start=0.1)
g = torch.Generator().manual_seed(a.seed)
t0 = time.time()
L = []
A = []
for step in range(1, a.steps + 1):
    idx = torch.randint(len(X), (a.bs,), generator=g)
    m.train()
    out = m(X[idx])
    loss = F.cross_entropy(out, Y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    sch.step()
    L.append(loss.item())
    A.append((out.argmax(1) == Y[idx]).float().mean().item())
    if step % 100 == 0:
        m.eval()
        with torch.no_grad():
            acc = sum(
                (m(Xv[i : i + 100]).argmax(1) == Yv[i : i + 100]).sum().item() for i in range(0, len(Xv), 100)
            ) / len(Xv)
        print(
            f"step {step} loss {sum(L[-100:]) / 100:.4f} tracc {sum(A[-100:]):.1f} val {100 * acc:.1f} "
            f"t {time.time() - t0:.0f}s",
            flush=True,
        )
