# Helpers the C++ tests call through /usr/bin/python3:
#   sampler N W SEED EPOCH DROP_LAST   -> each rank's torch DistributedSampler indices, one line a rank
#   checkpoint PATH                      -> loads a libddp checkpoint with torch.load, prints a summary
#   scaler PATH                          -> the checkpoint's loss-scaler state, a "key type value" line per entry
import sys

import torch
from torch.utils.data import DistributedSampler

if sys.argv[1] == 'sampler':
    n, w, seed, epoch, drop_last = (int(a) for a in sys.argv[2:7])
    for r in range(w):
        s = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=True, seed=seed, drop_last=bool(drop_last))
        s.set_epoch(epoch)
        print(' '.join(str(i) for i in s))
elif sys.argv[1] == 'scaler':
    ck = torch.load(sys.argv[2])
    if 'scaler' not in ck:
        print('no scaler')
    for k, v in ck.get('scaler', {}).items():
        print(k, type(v).__name__, v)
elif sys.argv[1] == 'checkpoint':
    ck = torch.load(sys.argv[2])
    assert ck['format'] == 'libddp-checkpoint', ck.keys()
    model = ck['model']
    assert all(not k.startswith('module.') for k in model), list(model)
    print('epoch', ck['epoch'], 'step', ck['step'], 'world', ck['world_size'], 'tensors', len(model),
          'sum %.6f' % sum(float(v.double().sum()) for v in model.values()))
