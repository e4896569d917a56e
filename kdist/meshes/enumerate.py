"""Enumerating meshes: every split of N devices over a list of roles."""

from kdist.checks import MAX_DEVICES, positive_int


def divisors(n):
    """The divisors of `n`, ascending (in O(sqrt n) steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def factorisations(n, k):
    """Every ordered way to write `n` as a product of `k` positive integers, largest first sizes first."""
    if k == 1:
        return [(n,)]
    return [(d, *rest) for d in divisors(n)[::-1] for rest in factorisations(n // d, k - 1)]


def meshes(devices, roles=("data", "fsdp", "model")):
    """Every assignment of `devices` to `roles` whose sizes multiply to `devices`.

    Each mesh is a dict role -> size with the axes of size 1 left out (the
    single-device mesh is `{"data": 1}`).

    >>> [m for m in meshes(4, ("data", "model"))]
    [{'data': 4}, {'data': 2, 'model': 2}, {'model': 4}]
    """
    devices = positive_int(devices, "devices", maximum=MAX_DEVICES)
    out = []
    for sizes in factorisations(devices, len(roles)):
        axes = {r: s for r, s in zip(roles, sizes) if s > 1}
        out.append(axes or {"data": 1})
    return out


def data_model_specs(devices):
    """Every "data x model" spec of `devices`: ["8x1", "4x2", "2x4", "1x8"] for 8."""
    return [f"{devices // m}x{m}" for m in divisors(devices)]


def spec_of(sizes):
    """ "data=2,model=4" from {"data": 2, "model": 4}."""
    return ",".join(f"{role}={size}" for role, size in sizes.items())
