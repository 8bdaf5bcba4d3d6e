"""Per-device memory accounting of live neuron storages (bytes).

Storages update their device's Account directly: it is on every op's path, and
attribute updates of a slotted object cost a fraction of Counter updates.
"""


class Account:
    __slots__ = ("allocated", "peak", "allocations", "ooms")

    def __init__(self):
        self.allocated = 0
        self.peak = 0
        self.allocations = 0
        self.ooms = 0  # allocations refused for lack of device memory

    def allocate(self, nbytes: int) -> None:
        """One allocation of `nbytes` (a new storage, or the new size of a resized one)."""
        self.allocations += 1
        self.allocated += nbytes
        if self.allocated > self.peak:
            self.peak = self.allocated


class _Accounts(dict):
    def __missing__(self, device_index: int) -> Account:
        self[device_index] = account = Account()
        return account


accounts = _Accounts()


def account(device_index: int) -> Account:
    return accounts[device_index]


def reset_peak(device_index: int) -> None:
    a = accounts[device_index]
    a.peak = a.allocated
