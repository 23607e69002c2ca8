"""An LSTM that draws its initial states with torch.randn inside forward (KernelBench L3-35):
every run draws, so runs compare only when they start from the same random state."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size):
        super().__init__()
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        h0 = torch.randn(self.num_layers, x.size(0), self.hidden_size, device=x.device)
        c0 = torch.randn(self.num_layers, x.size(0), self.hidden_size, device=x.device)
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :])


batch_size, sequence_length, input_size, hidden_size, num_layers, output_size = 3, 6, 8, 16, 2, 4


def get_inputs():
    return [torch.rand(batch_size, sequence_length, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size]
