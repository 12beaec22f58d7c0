# Writes the files Python users bring us, for state_dict_test.cpp:
#   dp_cuda.pt   model.state_dict() of nn.DataParallel(net) (module. prefixes),
#                with every storage tagged cuda:0 as a GPU run would save it
#   ckpt_dict.pt {'epoch': 3, 'model_state_dict': ..., 'optimizer_state_dict': ...}
# and checks that Python itself fails on dp_cuda.pt without map_location
# (the seeds' classic error), so the test is faithful. CPU-only torch cannot
# create CUDA tensors; the location tag is what torch.save records for them.
import sys

import torch

out = sys.argv[1]
net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
with torch.no_grad():
    net[0].weight.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5)
    net[0].bias.copy_(torch.tensor([-1.0, 1.0]))
    net[1].weight.fill_(2.0)
    net[1].bias.fill_(0.25)
    net[1].running_mean.copy_(torch.tensor([0.5, -0.5]))
    net[1].running_var.fill_(3.0)
    net[1].num_batches_tracked.fill_(7)

torch.save({'epoch': 3, 'model_state_dict': net.state_dict(),
            'optimizer_state_dict': torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9).state_dict()},
           out + '/ckpt_dict.pt')

torch.serialization.register_package(0, lambda obj: 'cuda:0', lambda obj, location: None)
torch.save(torch.nn.DataParallel(net).state_dict(), out + '/dp_cuda.pt')
torch.serialization._package_registry.pop(0)
try:
    torch.load(out + '/dp_cuda.pt')
    sys.exit('expected the CUDA deserialisation error')
except RuntimeError as e:
    assert 'CUDA' in str(e), e
print('ok')
