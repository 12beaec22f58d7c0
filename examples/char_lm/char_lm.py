# The PyTorch script main.cpp ports: a character-level language model, one
# process. The same model, data and defaults, for comparing the two:
#
#   python3 examples/char_lm/char_lm.py [--text FILE] [--epochs 20]
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
p.add_argument("--epochs", type=int, default=20)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--layers", type=int, default=1)
p.add_argument("--seq-len", type=int, default=64)
p.add_argument("--val-fraction", type=float, default=0.1)
p.add_argument("--weight-decay", type=float, default=0.01)
p.add_argument("--clip", type=float, default=1.0)
args = p.parse_args()

text = open(args.text, "rb").read()
alphabet = sorted(set(text))
index = {c: i for i, c in enumerate(alphabet)}
ids = torch.tensor([index[c] for c in text], dtype=torch.long)
split = len(ids) - int(args.val_fraction * len(ids))


def windows(ids, seq_len):
    n = (len(ids) - 1) // seq_len
    return ids[: n * seq_len].view(n, seq_len), ids[1 : n * seq_len + 1].view(n, seq_len)


train_x, train_y = windows(ids[:split], args.seq_len)
val_x, val_y = windows(ids[split:], args.seq_len)


class CharLM(nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(dim, vocab)
        self.head.weight = self.emb.weight  # tied
        nn.init.normal_(self.emb.weight, 0.0, 0.1)

    def forward(self, tokens):
        return self.head(self.gru(self.emb(tokens))[0])


torch.manual_seed(args.seed)
model = CharLM(len(alphabet), args.dim, args.layers)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
g = torch.Generator()
for epoch in range(args.epochs):
    model.train()
    g.manual_seed(args.seed + epoch)
    order = torch.randperm(len(train_x), generator=g)
    total, count = 0.0, 0
    for i in range(0, len(order), args.batch_size):
        b = order[i : i + args.batch_size]
        loss = F.cross_entropy(model(train_x[b]).flatten(0, 1), train_y[b].flatten())
        opt.zero_grad()
        loss.backward()
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        total += loss.item() * len(b)
        count += len(b)
    model.eval()
    with torch.no_grad():
        nats = F.cross_entropy(model(val_x).flatten(0, 1), val_y.flatten(), reduction="sum").item()
    bpc = nats / val_y.numel() / math.log(2)
    print(f"epoch {epoch + 1}: train loss {total / count:.4f} ({total / count / math.log(2):.3f} bits/char), "
          f"val {bpc:.4f} bits/char ({val_y.numel()} chars)")
