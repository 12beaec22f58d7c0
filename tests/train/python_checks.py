# Helpers the C++ tests call through /usr/bin/python3:
#   sampler N W SEED EPOCH DROP_LAST [N W SEED EPOCH DROP_LAST ...]
#                                        -> each case's torch DistributedSampler indices, one line a rank
#   checkpoint PATH                      -> loads a libddp checkpoint with torch.load, prints a summary
#   scaler PATH                          -> the checkpoint's loss-scaler state, a "key type value" line per entry
#   extra PATH                           -> the checkpoint's "extra" entries and its config's program options,
#                                           a "key type value" line each (tensors as lists)
#   extra-edit PATH                      -> adds entries to "extra" in Python (plain dicts, lists) and saves it back
#   extra-object PATH OUT                -> PATH with a Python object (os.system) in "extra", saved as OUT
import sys

import torch
from torch.utils.data import DistributedSampler

if sys.argv[1] == 'sampler':
    numbers = [int(a) for a in sys.argv[2:]]
    for case in range(0, len(numbers), 5):
        n, w, seed, epoch, drop_last = numbers[case:case + 5]
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
elif sys.argv[1] == 'extra':
    ck = torch.load(sys.argv[2])

    def show(v):
        if isinstance(v, torch.Tensor):
            return 'tensor(%s %s)' % (str(v.dtype).replace('torch.', ''), v.tolist())
        if isinstance(v, dict):
            return '{' + ', '.join('%r: %s' % (k, show(x)) for k, x in v.items()) + '}'
        if isinstance(v, (list, tuple)):
            items = ', '.join(show(x) for x in v)
            return '[' + items + ']' if isinstance(v, list) else '(' + items + ')'
        return repr(v)

    for k, v in ck['extra'].items():
        print(k, type(v).__name__, show(v))
    print('config', ck['config']['dim'], ck['config']['sample_len'], ck['config']['lr'])
elif sys.argv[1] == 'extra-edit':
    ck = torch.load(sys.argv[2])
    ck['extra']['from_python'] = {'note': 'edited', 'ids': [3, 1, 2], 'mixed': [1, 'a', None], 'empty': []}
    # One object in many places: pickle writes it once and refers back to it (a memo).
    tag, row = 'edited' * 100, [1, 2]
    ck['extra']['shared'] = {'tags': [tag] * 1000, 'rows': [row, row]}
    ck['extra']['best_loss'] = 0.25
    torch.save(ck, sys.argv[2])
    print('saved')
elif sys.argv[1] == 'extra-object':
    import os
    ck = torch.load(sys.argv[2])
    ck['extra']['hook'] = {'run': os.system}
    torch.save(ck, sys.argv[3])
    print('saved')
