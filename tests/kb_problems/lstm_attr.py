"""An LSTM whose initial states are plain tensor attributes drawn in __init__ (an earlier
KernelBench L3-35): `model.to(dtype)` leaves them as they were."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size):
        super().__init__()
        self.h0 = torch.randn((num_layers, batch_size, hidden_size))
        self.c0 = torch.randn((num_layers, batch_size, hidden_size))
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        self.h0 = self.h0.to(x.device)
        self.c0 = self.c0.to(x.device)
        out, _ = self.lstm(x, (self.h0, self.c0))
        return self.fc(out[:, -1, :])


batch_size, sequence_length, input_size, hidden_size, num_layers, output_size = 3, 6, 8, 16, 2, 4


def get_inputs():
    return [torch.rand(batch_size, sequence_length, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size]
