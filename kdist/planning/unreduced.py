"""A weight's gradient before its reduction over fsdp: whole on each device, or a lookup table's by rows.

Under FSDP XLA makes a weight's local gradient whole (less its model split)
and reduce-scatters it to the device's shard next (`add_unreduced`). A table
only embedding lookups read gets its gradient from a scatter-add of the
lookups' cotangents into zeros; where fsdp splits its rows, XLA's SPMD
partitioner may scatter into each device's rows instead, from the cotangents
of the device's fsdp group, all-gathered: no whole gradient is made
(`add_gathered_cotangents`, `lookup_factors`; docs/plan.md, "A lookup
table's gradient over fsdp").
"""

from kdist.meshes.layout import split_by


def add_unreduced(step, summed):
    """FSDP: a weight's gradient is made whole (less its model split) and reduce-scattered to a shard next, the
    whole copy alive from the kernel making it to the next event (scaled to 0 where fsdp does not split the
    weight); a gradient `summed` into another (a weight several calls read) is not reduced, the sum is."""
    events = step.events
    for t, (made, _, _) in enumerate(events):
        for g in list(made):
            if step.term[g] == "gradients" and g in step.weight_of and g not in summed and t + 1 < len(events):
                u = step.new(step.size[g], step.shape[g], "unreduced", step.dtype[g])
                step.weight_of[u] = step.weight_of[g]
                made.append(u)
                events[t + 1] = (events[t + 1][0], (*events[t + 1][1], u), events[t + 1][2])


def add_gathered_cotangents(step):
    """Record in `step.lookup_scatters` each backward kernel scattering the gradient of a table only lookups read
    into its zeros, as (gradient, zeros, unreduced copy, cotangent, gathered copy of the cotangent).

    The copy (the rest of the fsdp group's cotangents where the scatter is by rows) is made with the cotangent
    and read by the scatter; `lookup_factors` decides per mesh and sizes it, the zeros and the unreduced copy.
    """
    externals = step.weight_buffers()
    made_at = {g: t for t, (made, _, _) in enumerate(step.events) for g in made}
    for t in range(step.bwd_start or 0, len(step.events)):
        made, read, writable = step.events[t]
        grads = [g for g in made if step.term[g] == "gradients" and g in step.weight_of]
        if step.event_kinds[t] != "kernel" or len(grads) != 1:
            continue
        grad = grads[0]
        if not step.looked_up.get(externals.get(step.weight_of[grad])):
            continue
        zeros = [r for r in read if step.shape[r] == step.shape[grad] and step.term[r] == "backward"]
        cotangents = [r for r in read if step.batch[r] and step.dtype[r] == step.dtype[grad]]
        unreduced = [g for g in made if step.term[g] == "unreduced"]
        if len(zeros) != 1 or len(cotangents) != 1 or len(unreduced) != 1:
            continue
        copy = step.new(step.size[cotangents[0]], step.shape[cotangents[0]], "backward", step.dtype[grad])
        step.events[made_at.get(cotangents[0], t)][0].append(copy)
        step.events[t] = (made, (*read, copy), writable)
        step.lookup_scatters.append((grad, zeros[0], unreduced[0], cotangents[0], copy))


def lookup_factors(step, rows, rep, out, fsdp):
    """Set, in `out` (per buffer: its bytes on one device / at the traced batch, `memory_model.buffer_factors`),
    the factors of each lookup table's gradient on a mesh of `fsdp` devices over fsdp. `rows`: the candidate's
    placed variables; `rep`: per buffer, its variable's row."""
    for grad, zeros, unreduced, cotangent, copy in step.lookup_scatters:
        table, own = rows[rep[grad]], step.size[cotangent] * out[cotangent]
        by_rows = fsdp > 1 and split_by(table.spec, "fsdp")[:1] == [True] and scatters_by_rows(table, own, fsdp)
        if by_rows:  # into the device's rows, in place over their zeros: no whole gradient
            out[zeros], out[unreduced] = table.shard_bytes / table.full_bytes, 0.0
        out[copy] = out[cotangent] * (fsdp - 1) if by_rows else 0.0  # the rest of the fsdp group's cotangents


def scatters_by_rows(table, cotangent_bytes, fsdp):
    """Whether XLA's partitioner scatters the gradient of lookup table `table` (its rows split over `fsdp` devices)
    into each device's rows, from its fsdp group's cotangents all-gathered (`cotangent_bytes` a device's own),
    rather than into a whole table per device that is then reduced.

    It takes the method whose largest partitioned scatter or collective holds fewer bytes
    (`GatherScatterPartitionMethodsOrderedByCost`, xla/service/spmd/gather_scatter_handler.cc): by rows the
    scatter holds the zeros and gradient of the device's rows and the group's cotangents, whole it holds two whole
    tables and the device's own cotangents.
    """
    whole = table.full_bytes
    return 2 * whole / fsdp + cotangent_bytes * fsdp < 2 * whole + cotangent_bytes
