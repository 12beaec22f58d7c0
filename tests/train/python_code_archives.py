# Writes archives that carry TorchScript code, for hostile_checkpoint_test.cpp:
#   code_module.pt      a TorchScript module whose __setstate__ creates (or
#                       overwrites) the file named by argv[2] with 64 'X's,
#                       as torch::load or torch::jit::load would run it
#   code_checkpoint.pt  a libddp checkpoint of nn.Linear(3, 2) whose
#                       "optimizer" entry is that archive's bytes
# A reader that runs no code from the file leaves argv[2] absent.
import io
import sys
from typing import Tuple

import torch

out, victim = sys.argv[1], sys.argv[2]


class Payload(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2, 3))
        self.target = victim

    def forward(self, x):
        return x

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool, str]:
        return (self.weight, self.training, self.target)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool, str]) -> None:
        mapped = torch.from_file(state[2], True, 64, dtype=torch.uint8)
        mapped.fill_(88)
        self.weight = state[0] + mapped[0].float() * 0.0
        self.training = state[1]
        self.target = state[2]


module = torch.jit.script(Payload())
buf = io.BytesIO()
torch.jit.save(module, buf)
code = buf.getvalue()
with open(out + '/code_module.pt', 'wb') as f:
    f.write(code)

linear = torch.nn.Linear(3, 2)
torch.save({'format': 'libddp-checkpoint', 'version': 1, 'model': linear.state_dict(),
            'optimizer': torch.frombuffer(bytearray(code), dtype=torch.uint8),
            'epoch': 1, 'step': 1, 'sampler_epoch': 1, 'epoch_step': 0, 'world_size': 1,
            'rng_states': [torch.get_rng_state()], 'config': {}}, out + '/code_checkpoint.pt')
print('ok')
