"""Zero pads XLA folds into the convolutions that read them: no buffer of their own.

XLA's algebraic simplifier folds a zero pad of a convolution's input's
spatial dimensions into the convolution's window (`FoldConvInputPad`): the
forward convolution and its weight gradient read the unpadded value (a
ZeroPadding2D before a "valid" convolution); the input gradient is still
the padded shape, then sliced. Where a convolution gathers its input over
a model axis XLA pads first, and the gathered copy is the padded value
(docs/plan.md, "Zero pads folded into convolutions").
"""


def zero_pad_dims(f, i):
    """The dimensions pad `i` of flat program `f` pads, or None where XLA cannot fold it into a convolution: a
    padding value other than 0 or not fixed at trace time, interior or negative padding."""
    config, value = f.params[i]
    if value is None or value != 0 or any(lo < 0 or hi < 0 or interior for lo, hi, interior in config):
        return None
    return {d for d, (lo, hi, _) in enumerate(config) if lo or hi}


def convolved_only(p, x, dims, readers):
    """Whether value `x` of program `p`, read by equations `readers`, is no output of `p` and is read only as the
    input of convolutions, `dims` among their spatial dimensions."""
    f = p.flat

    def convolves(r):
        prim, ins, _ = f.eqns[r]
        return (
            prim == "conv_general_dilated"
            and ins[0] == x
            and x not in ins[1:]
            and dims <= set(f.params[r].lhs_spec[2:])
        )

    return bool(readers) and x not in set(p.out) and all(map(convolves, readers))


def folds_within(i, p, consumers):
    """Whether pad `i` of program `p` is read only by convolutions within `p`, which take it as padding: a view of
    its operand (`buffers.analyse`)."""
    out, dims = p.flat.eqns[i][2][0], zero_pad_dims(p.flat, i)
    return dims is not None and convolved_only(p, out, dims, consumers[out])


def folded_across(step):
    """Layer outputs of `step` that are zero pads the next layers' convolutions read, as their padding -> the
    buffer they pad, which those convolutions read instead (`timeline.Step._resolve`)."""
    folded = {}
    for g, ((p, mapping), lid, _, _) in step.cond.items():
        i = p.producer_index.get(lid)
        if i is None or p.flat.eqns[i][0] != "pad" or p.flat.eqns[i][1][0] not in mapping:
            continue
        dims, readers = zero_pad_dims(p.flat, i), step.readers.get(g, [])
        if dims is None or not readers or _readers(p, lid):  # a layer reading its own pad keeps it
            continue
        if all(convolved_only(q, x, dims, _readers(q, x)) for (q, _), x in readers):
            folded[g] = mapping[p.flat.eqns[i][1][0]]
    return folded


def folded_operand(p, x, mapping):
    """The buffer that value `x` of program `p` pads, where `x` is a pad folded within `p`, else None."""
    i = p.producer_index.get(x)
    if i is None or p.kinds[i] != "alias" or p.flat.eqns[i][0] != "pad":
        return None
    return mapping.get(p.flat.eqns[i][1][0])


def gather_padded(step, gathered, enlarged):
    """Where convolutions gather a pad folded across layers (`gathered`: buffer -> axes), gather the buffer it
    pads, at the padded size (`enlarged`: buffer -> {axis: times}; `propagation.split_axes`)."""
    for g, source in step.folded.items():
        if g in gathered:
            gathered.setdefault(source, set()).update(gathered[g])
            enlarged[source] = {a: step.size[g] / step.size[source] for a in gathered[g]}


def _readers(p, x):
    """The equations of program `p` that read its value `x`."""
    return [r for r, (_, ins, _) in enumerate(p.flat.eqns) if x in ins]
