# Writes the binary fuzz seeds: small state dicts and checkpoints that
# Python's torch.save makes, valid and slightly broken, for the torch_pickle,
# state_dict and checkpoint harnesses (fuzz/corpus/<harness>/py-*.pt), and
# idx files for idx_fuzz. Run with PyTorch 1.13:
#   /usr/bin/python3 fuzz/seeds/make_seeds.py fuzz/corpus
# The seeds are committed; this script is how to make them again. The text
# seeds (CSV, host lists, environments, command lines) are written by hand,
# and the libddp checkpoint by fuzz/seeds/make_libddp_seeds.cpp.
import collections
import gzip
import io
import os
import struct
import sys

import torch

corpus = sys.argv[1]
torch.manual_seed(0)
# The harnesses load into Linear(2, 3) (weight [3, 2], bias [3]).
net = torch.nn.Linear(2, 3)
sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
net(torch.ones(1, 2)).sum().backward()
sgd.step()

seeds = {
    'py-state-dict.pt': net.state_dict(),
    'py-module-prefix.pt': collections.OrderedDict(('module.' + k, v) for k, v in net.state_dict().items()),
    'py-plain-dict.pt': {'weight': torch.zeros(3, 2), 'bias': torch.arange(3, dtype=torch.float64)},
    'py-mixed-types.pt': {'i': torch.tensor([1, 2], dtype=torch.int64), 'h': torch.ones(2, dtype=torch.float16),
                          'b': torch.tensor([True, False]), 'u': torch.tensor([7], dtype=torch.uint8),
                          'scalar': torch.tensor(3.5)},
    'py-views.pt': {'t': torch.arange(12.).reshape(3, 4).t(), 'n': torch.arange(10.)[2:7],
                    'shared': torch.arange(6.)},
    'py-ckpt-dict.pt': {'epoch': 3, 'model_state_dict': net.state_dict(), 'optimizer_state_dict': sgd.state_dict(),
                        'note': 'text', 'values': [1, 2.5, None, True, (1, 'a')]},
    'py-empty.pt': {},
}
def saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


files = {name: saved(obj) for name, obj in seeds.items()}
valid = files['py-state-dict.pt']
files['py-truncated.pt'] = valid[:len(valid) // 2]
flipped = bytearray(valid)
flipped[len(valid) // 3] ^= 0x40  # inside data.pkl or a storage: a CRC that no longer matches
files['py-flipped.pt'] = bytes(flipped)
for harness in ('torch_pickle_fuzz', 'state_dict_fuzz', 'checkpoint_fuzz'):
    os.makedirs(os.path.join(corpus, harness), exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(corpus, harness, name), 'wb') as f:
            f.write(data)


def idx(magic, dims, payload):
    return struct.pack('>I', magic) + b''.join(struct.pack('>I', d) for d in dims) + payload


images = idx(0x803, (2, 3, 3), bytes(range(18)))
labels = idx(0x801, (3,), bytes([0, 9, 4]))
idx_files = {
    'images-2x3x3': images,
    'images-2x3x3.gz': gzip.compress(images, mtime=0),
    'labels-3': labels,
    'labels-3.gz': gzip.compress(labels, mtime=0),
    'labels-empty': idx(0x801, (0,), b''),
    'images-truncated': images[:-5],
    'images-longer': images + b'x',
    'images-bad-magic': idx(0x804, (2, 3, 3), bytes(18)),
    'images-huge-count': idx(0x803, (0x7fffffff, 28, 28), bytes(8)),
    'gz-truncated': gzip.compress(images, mtime=0)[:20],
}
os.makedirs(os.path.join(corpus, 'idx_fuzz'), exist_ok=True)
for name, data in idx_files.items():
    with open(os.path.join(corpus, 'idx_fuzz', name), 'wb') as f:
        f.write(data)

# LibTorch archives for module_archive_fuzz: a TorchScript module with every
# kind of attribute the data-only reader rebuilds, libddp's SGD state (the
# "optimizer" bytes of the committed libddp checkpoint), and, for the
# pickle readers, a state dict whose data.pkl is deflated.
# The code-*.pt seeds come from tests/train/python_code_archives.py, run with
# /tmp/ddp-fuzz-code-ran as its victim (fuzz/code_sentinel.h).
import typing
import zipfile

src = os.path.join(corpus, 'module_archive_fuzz', 'ddp_seed_attrs.py')
os.makedirs(os.path.dirname(src), exist_ok=True)
with open(src, 'w') as f:
    f.write('''import torch
from typing import Dict, List, Optional, Tuple


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer('running', torch.arange(3.))
        self.scale = 2.5

    def forward(self, x):
        return x


class Attrs(torch.nn.Module):
    ints: List[int]
    tensors: List[torch.Tensor]
    table: Dict[str, List[float]]
    pair: Tuple[float, float]
    maybe: Optional[float]

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3, 2))
        self.inner = Inner()
        self.ints = [1, 2, 3]
        self.tensors = [torch.zeros(2), torch.ones(1)]
        self.table = {'lr': [0.1, 0.01], 'empty': []}
        self.pair = (0.9, 0.999)
        self.maybe = None
        self.name = 'attrs'

    def forward(self, x):
        return x
''')
sys.path.insert(0, os.path.dirname(src))
import ddp_seed_attrs  # noqa: E402
buf = io.BytesIO()
torch.jit.save(torch.jit.script(ddp_seed_attrs.Attrs()), buf)
os.remove(src)
archives = {'py-jit-attrs.pt': buf.getvalue()}
ckpt = torch.load(os.path.join(corpus, 'checkpoint_fuzz', 'ddp-checkpoint.pt'))
archives['ddp-sgd-archive.pt'] = ckpt['optimizer'].numpy().tobytes()
for name, data in archives.items():
    with open(os.path.join(corpus, 'module_archive_fuzz', name), 'wb') as f:
        f.write(data)

# A libddp checkpoint whose "extra" refers to one list from two places, 60
# levels down: 61 lists in the file, 2^60 read as a tree (a hostile file;
# load_checkpoint refuses it in bounded memory).
shared = ['x']
for _ in range(60):
    shared = [shared, shared]
ckpt['extra'] = {'shared': shared}
with open(os.path.join(corpus, 'checkpoint_fuzz', 'crash-shared-extra'), 'wb') as f:
    f.write(saved(ckpt))

deflated = io.BytesIO()
with zipfile.ZipFile(io.BytesIO(valid)) as zin, zipfile.ZipFile(deflated, 'w') as zout:
    for info in zin.infolist():
        method = zipfile.ZIP_DEFLATED if info.filename.endswith('data.pkl') else zipfile.ZIP_STORED
        zout.writestr(info.filename, zin.read(info.filename), compress_type=method)
with open(os.path.join(corpus, 'torch_pickle_fuzz', 'py-deflated-pickle.pt'), 'wb') as f:
    f.write(deflated.getvalue())
print('ok')
