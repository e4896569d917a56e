"""The training step as a timeline of kernels over buffers, and the sweep that finds its memory peak.

`Step` collects the calls of every layer (forward), the loss, every layer's
backward in reverse, gradient sums and the optimizer update, each as kernel
events over global buffer ids. `emit` decides which layer outputs XLA fuses
away (across layer boundaries) and adds FSDP's gathered weights; `sweep`
then keeps each buffer alive from the kernel that makes it to the last one
that reads it, and returns the live bytes per term after every event. Sizes
are at the traced batch; a per-candidate factor per buffer rescales them.
`sublayer_spans` marks each sublayer's run of backward kernels, inside which
XLA's latency-hiding scheduler may reorder (`memory_model.scheduler_lasts`).
"""

import math

import numpy as np

from kdist.planning import convolutions, gradient_waits, unreduced
from kdist.planning.buffers import fuse_into_readers, is_relu
from kdist.planning.primitives import POOL_GRADIENT
from kdist.planning.trace import TRACE_BATCH
from kdist.planning.zero_pads import folded_across

TERMS = ("activations", "loss", "backward", "gradients", "gathered", "unreduced")


class Step:
    """One training step's buffers (`size`, `shape`, `dtype`, `term`, `batch`) and its kernel `events`."""

    def __init__(self, rules):
        self.rules = rules
        self.size, self.shape, self.dtype, self.term, self.batch = [], [], [], [], []
        self.weight_of = {}  # buffer -> index of the variable it is a copy, gradient or gathered copy of
        self.var_bytes, self.var_itemsize = [], []
        self.events = []  # (buffers made, buffers read, buffers read it may write over: elementwise kernels)
        self.agenda = []  # ("run", instance, lo, hi) | ("acc", out, parts) | ("opt", grad) | ("loss_start",)
        self.cond = {}  # layer output / input cotangent -> (instance, local id, expensive, internal readers)
        self.readers = {}  # buffer -> [(instance, local id)] of the calls reading it
        self.forced = set()  # tensors that must be buffers (summed cotangents, a folded pad's operand)
        self.folded = {}  # a zero pad only convolutions read, as their padding -> the buffer they read instead
        self.virtual = {}  # tensor fused into its readers -> the buffers it is computed from
        self.bwd_start = None
        self.sublayer_spans = []  # (first, last event, key) of each sublayer's backward run: `_extend_span`
        self.looked_up = {}  # weight (or cast) -> whether every call reading it only looks rows up: no FSDP gather
        self.merged = []  # (shared input, outputs, biased sums) of a call's GEMMs XLA may merge: `Program.merged`
        self.derived = {}  # buffer -> the buffer whose model-axis split it takes (`convolutions.max_pool_gradient`)
        # (program, local id) -> the buffer every call of it shares, computed from constants alone: the first
        # kernel making it makes it (`batched_gathers`)
        self.shared = {}
        # buffer -> (when, event): a max pool gradient's buffer made with the gradient at `event`, at the start of
        # the backward or after its first pool's (`convolutions.LATE`, ...), each on the meshes where XLA makes it
        # so (`memory_model._pool_orders`)
        self.overlapped = {}
        self.relu_outputs = set()  # layer outputs made by a max with a constant, a ReLU's (`convolutions`)
        self.unpartitioned = {}  # whole copy XLA makes on a mesh of several devices -> the buffer (`_fft_copies`)
        # a column reduction's side output or summed product -> rows it sums per example (None: on every mesh)
        self.column_rows = {}
        self.widened = set()  # float32 products a weight gradient's reduction sums late (`column_reductions`)
        self.conv_kernels = {}  # variable -> [the weight a forward convolution reads, events reading it or a copy]
        self.windowed_kernels = set()  # variables a convolution reads as a kernel wider than 1 x 1 (`convolutions`)
        self.lookup_scatters = []  # a lookup table's gradient, its zeros and cotangents (`unreduced`)
        # caches of what the events give: `lifetimes`, `gradient_kernels`, `branches.forks`
        self._life = self._gradient_kernels = self._forks = self._reads = None
        # For the step time (`kdist.planning.timing`), per event: FLOPs at the traced batch, dtype and the
        # shapes of the operation it runs (and its kind, for `gradient_kernels`); per variable: the events using
        # it and its final gradient buffer.
        self.event_flops, self.event_dtype, self.event_shapes, self.event_kinds = [], [], [], []
        self.event_gemms = []  # whether each event is a matrix product (a cuBLAS GEMM on a GPU)
        self.weight_uses, self.final_grads = {}, []

    def new(self, size, shape, term="activations", dtype="float32"):
        self.size.append(size)
        self.shape.append(tuple(shape))
        self.dtype.append(str(dtype))
        self.term.append(term)
        self.batch.append(any(d > 0 and d % TRACE_BATCH == 0 for d in shape))
        return len(self.size) - 1

    def external(self, shape=(), dtype="float32"):
        """A buffer the sweep does not count: weights, optimizer state, the batch (counted exactly elsewhere)."""
        return self.new(0, shape, "external", dtype)

    def instance(self, p, inputs, term):
        """Record one call of analysed program `p`; `inputs` maps its external ids to global ones.

        Returns the instance (p, mapping local id -> global id). Buffers get
        `term`, or "activations" / "backward" by the part that makes them.
        """
        f = p.flat
        mapping = dict(inputs)
        inst = (p, mapping)
        for x in range(len(f.size)):
            if x in mapping or not (p.mat[x] or p.out_info.get(x, ("",))[0] == "cond"):
                continue
            if x in p.gw:
                t = "gradients"
            elif term is not None:
                t = term
            else:
                t = "activations" if _made_forward(p, x) else "backward"
            shared = x in p.constants and t == "activations"  # a forward value computed alike by every call
            if shared and (id(p), x) in self.shared:
                mapping[x] = self.shared[id(p), x]
                continue
            mapping[x] = self.new(f.size[x] * p.index_scales.get(x, 1), f.shape[x], t, f.dtype[x])
            if shared:
                self.shared[id(p), x] = mapping[x]
        for v, _, _, rows in p.side_outputs:  # written out on meshes where its reduction is one kernel (None: all)
            g = mapping[("side", v)] = self.new(f.size[v], f.shape[v], "activations", f.dtype[v])
            self.column_rows[g] = rows  # split as a value it is computed from of its shape (or a transpose of it)
            self.derived.update((g, mapping[r]) for r in p.roots[v] if sorted(f.shape[r]) == sorted(f.shape[v]))
        for x, rows in p.widened:  # written out on meshes where its reduction is one kernel
            self.widened.add(mapping[x])
            self.column_rows[mapping[x]] = rows
        for o in p.gw:
            if o in p.zero_grads:
                mapping[o] = None
            elif o not in mapping:  # a bitcast (transpose) of a dot's output
                mapping[o] = mapping[p.roots[o][0]]
                if self.term[mapping[o]] != "external":
                    self.term[mapping[o]] = "gradients"
        for x, w in p.weight_copy.items():
            if mapping.get(x) is not None and w in mapping and mapping[w] in self.weight_of:
                self.weight_of.setdefault(mapping[x], self.weight_of[mapping[w]])
        for o, (kind, extra) in p.out_info.items():  # outputs, input cotangents and the values they are views of
            if kind == "alias":
                mapping[o] = mapping[extra]
            elif kind == "cond":
                self.cond[mapping[o]] = (inst, o, extra[0], extra[1])
        for x in list(p.a) + list(p.c) + list(p.ct):
            self.readers.setdefault(mapping[x], []).append((inst, x))
        for o in p.out:
            i = p.producer_index.get(o)
            if i is not None and is_relu(f.eqns[i]):
                self.relu_outputs.add(mapping[o])
        for shared, outs, sums in p.merged:
            self.merged.append((mapping.get(shared), [mapping[o] for o in outs], [mapping.get(x) for x in sums]))
        for x in {*p.w, *p.c, *p.lookups}:
            if mapping.get(x) is not None:
                self.looked_up[mapping[x]] = self.looked_up.get(mapping[x], True) and x in p.lookups
        return inst

    def add_cotangent(self, cotangents, tensor, ct):
        """Record cotangent `ct` of `tensor`; a second one is summed (both then buffers)."""
        old = cotangents.get(tensor)
        if old is None:
            cotangents[tensor] = ct
            return
        self.forced.update((old, ct))
        total = self.new(self.size[ct], self.shape[ct], "backward", self.dtype[ct])
        self.agenda.append(("acc", total, [old, ct]))
        cotangents[tensor] = total

    def _resolve(self):
        """Decide which layer outputs / input cotangents are buffers; the rest are recomputed by each reader."""
        memo = {}
        self.folded = folded_across(self)
        self.forced.update(self.folded.values())
        for g in sorted(self.cond):
            if g in self.folded:
                self.virtual[g] = (self.folded[g],)
                continue
            inst, lid, expensive, internal = self.cond[g]
            readers = self.readers.get(g, [])
            n_read = internal + sum(p.in_readers[x] for (p, _), x in readers)
            needs = g in self.forced or any(p.in_needs_buffer[x] for (p, _), x in readers)
            needs = needs or (expensive and n_read > 1)
            p, mapping = inst
            if not needs and self.rules.bandwidth_fusion:
                roots = {r for root in p.roots[lid] for r in self._expand(mapping[root], memo)}
                needs = not fuse_into_readers(n_read, sum(self.size[r] for r in roots), self.size[g])
            if not needs:
                self.virtual[g] = tuple(mapping[r] for r in p.roots[lid])

    def _expand(self, g, memo):
        """The buffers a (possibly fused-away) tensor is computed from."""
        if g not in self.virtual:
            return (g,)
        if g not in memo:
            memo[g] = _once(r for root in self.virtual[g] for r in (self._expand(root, memo) if root != g else (g,)))
        return memo[g]

    def emit(self, remat, gather_itemsize):
        """Write the events in execution order (after `_resolve`), then FSDP's gathered weights."""
        self._resolve()
        memo = {}
        self.events = []
        self.event_flops, self.event_dtype, self.event_shapes, self.event_kinds = [], [], [], []
        self.event_gemms, self.final_grads, self.sublayer_spans = [], [], []
        self.conv_kernels, self.windowed_kernels = {}, set()
        forward_start = {}  # per call (its mapping): the first event of its forward run
        shared, shared_made = set(self.shared.values()), set()
        summed = set()  # gradients and cotangents summed into another (`unreduced.add_unreduced`)
        for item in self.agenda:
            if item[0] == "loss_start":
                self.bwd_start = len(self.events) if self.bwd_start is None else self.bwd_start
            elif item[0] == "run":
                _, (p, mapping), lo, hi = item
                backward = lo > 0 and lo == p.n_fwd
                forward_start.setdefault(id(mapping), len(self.events))
                for i, made, maybe, used, inplace in p.kernels:
                    if not lo <= i < hi:
                        continue
                    made = [mapping[o] for o in made] + [mapping[o] for o in maybe if mapping[o] not in self.virtual]
                    made = [g for g in made if g not in shared_made]
                    shared_made.update(g for g in made if g in shared)
                    pooled = zeros = ()
                    if backward and p.flat.eqns[i][0] == POOL_GRADIENT:
                        cotangent, operand = p.flat.eqns[i][1][:2]
                        made, pooled, zeros = convolutions.max_pool_gradient(
                            self, made, p.flat.shape[cotangent], mapping.get(operand), forward_start[id(mapping)]
                        )
                    made += [mapping[("side", v)] for v, reduction, _, _ in p.side_outputs if reduction == i]
                    if made or p.kinds[i] == "kernel":
                        read = _once(r for x in used for r in self._expand(mapping[x], memo)) + pooled
                        read += tuple(mapping[("side", v)] for v, _, last, _ in p.side_outputs if last == i)
                        if p.flat.eqns[i][0] == "fft":
                            whole = self._fft_copies((*made, *read))
                            made, read = [*made, *whole], (*read, *whole)
                        writable = {r for x in inplace for r in self._expand(mapping[x], memo)} | set(zeros)
                        self.events.append((made, read, tuple(r for r in read if r in writable)))
                        _, ins, outs = p.flat.eqns[i]
                        self._event_info(p.flat.flops[i], p.flat.dtype[outs[0]] if outs else "float32",
                                         tuple(p.flat.shape[x] for x in (*ins, *outs)), p.kinds[i],
                                         p.flat.eqns[i][0] == "dot_general")  # fmt: skip
                        if p.flat.eqns[i][0] == "conv_general_dilated":
                            kernel = {r for root in p.roots[ins[1]] or () for r in self._expand(mapping[root], memo)}
                            window = math.prod(p.flat.shape[ins[1]][d] for d in p.flat.params[i].rhs_spec[2:])
                            convolutions.note_kernel_reads(self, kernel, backward, window)
                        if backward:  # a layer call's (trace_layer names every equation's sublayer)
                            self._extend_span(len(self.events) - 1, (id(mapping), p.sublayers[i]))
            elif item[0] == "acc":
                read = _once(r for x in item[2] for r in self._expand(x, memo))
                self.events.append(([item[1]], read, read))
                summed.update(read)
                self._event_info()
            else:  # "opt": the optimizer update reads the gradient
                self.events.append(([], self._expand(item[1], memo), ()))
                self._event_info()
                if item[1] in self.weight_of:  # (variable, its gradient, the update reading it)
                    self.final_grads.append((self.weight_of[item[1]], item[1], len(self.events) - 1))
        self._add_gathers(remat, gather_itemsize)
        convolutions.add_kernel_copies(self)
        unreduced.add_unreduced(self, summed)
        unreduced.add_gathered_cotangents(self)
        self._life = self._gradient_kernels = self._forks = self._reads = None

    def _fft_copies(self, buffers):
        """An FFT's whole copies of its operand and output, `buffers` (copy -> the buffer): gathered copies alive
        while it runs, counted on meshes that split the batch or the features (`memory_model.buffer_factors`).

        XLA's SPMD partitioner splits an FFT only along the dimensions it
        transforms (FNet on model=4: an all-to-all, then a loop of collective
        permutes over c64[32,128,64] parts); over a split batch it gathers
        the operand to every device, transforms all of it and slices its own
        part of the output back (FNet on fsdp=8: two c64[32,256,256] values
        at XLA's peak, the whole batch of 32).
        """
        copies = {self.new(self.size[g], self.shape[g], "gathered", self.dtype[g]): g for g in buffers if self.size[g]}
        self.unpartitioned.update(copies)
        return list(copies)

    def longest_sublayer_backward(self):
        """The most kernels any sublayer's backward run has (`sublayer_spans`); 0 untraced."""
        return max((end - first + 1 for first, end, _ in self.sublayer_spans), default=0)

    def _extend_span(self, t, key):
        """Event `t` of a backward: it extends the sublayer's span that ended at t - 1, or starts a new one."""
        if self.sublayer_spans and self.sublayer_spans[-1][2] == key and self.sublayer_spans[-1][1] == t - 1:
            self.sublayer_spans[-1] = (self.sublayer_spans[-1][0], t, key)
        else:
            self.sublayer_spans.append((t, t, key))

    def _event_info(self, flops=0, dtype="float32", shapes=(), kind="other", gemm=False):
        self.event_gemms.append(gemm)
        self.event_flops.append(flops)
        self.event_dtype.append(str(dtype))
        self.event_shapes.append(shapes)
        self.event_kinds.append(kind)

    def _add_gathers(self, remat, gather_itemsize):
        """FSDP: each weight a kernel reads is all-gathered before it (full size here; 0 after scaling without fsdp).

        Without remat XLA gathers once and keeps the copy from the forward use to the last backward use. With
        per-layer remat the recomputed forward sits behind an optimization barrier and gathers again: one copy lives
        through the layer's forward, another through its backward; so does a GPU convolution kernel wider than 1 x 1
        (`windowed_kernels`), whose input gradient reads its filter-layout copy, gathered again. A table only
        embedding lookups read (`looked_up`) is not gathered.
        """
        events = [(list(m), list(u), ip) for m, u, ip in self.events]
        uses = {}
        for t, (_, used, _) in enumerate(events):
            for x in used:
                if self.looked_up.get(x):
                    continue
                if x in self.weight_of and self.term[x] in ("external", "activations", "backward"):
                    uses.setdefault(self.weight_of[x], []).append(t)
        self.weight_uses = {var: sorted(set(times)) for var, times in uses.items()}
        split = self.bwd_start if self.bwd_start is not None else len(events)
        externals = self.weight_buffers()
        for var, times in uses.items():
            times = sorted(set(times))
            w = externals[var]
            size = self.var_bytes[var] // self.var_itemsize[var] * gather_itemsize[var]
            again = remat or (var in self.windowed_kernels and self.rules.platform == "gpu")
            spans = [[t for t in times if t < split], [t for t in times if t >= split]] if again else [times]
            for span in spans:
                if span:
                    g = self.new(size, self.shape[w], "gathered", self.dtype[w])
                    self.weight_of[g] = var
                    events[span[0]][0].append(g)
                    events[span[-1]][1].append(g)
        self.events = [(m, tuple(u), ip) for m, u, ip in events]

    def weight_buffers(self):
        """{variable: the buffer of the weight itself} (not a cast, gradient or gathered copy of it)."""
        return {v: g for g, v in self.weight_of.items() if self.term[g] == "external"}

    def lifetimes(self):
        """(born, last read, external, reused) per buffer: computed once, every candidate's sweep reuses them.

        `reused`: (buffer, output): an elementwise or scatter kernel writes the output over the buffer it reads last.
        """
        if self._life is not None:
            return self._life
        n = len(self.size)
        last, born = np.full(n, -1), np.full(n, -1)
        for t, (made, used, _) in enumerate(self.events):
            last[list(used)] = t
            born[made] = t
        external = np.array([t == "external" for t in self.term])
        reused, taken = [], set()
        gathered = {entry[-1] for entry in self.lookup_scatters}  # a collective's output: not written over its input
        for t, (made, _, writable) in enumerate(self.events):
            for o in (o for o in made if o not in gathered):
                for x in writable:
                    same = self.size[x] == self.size[o] > 0 and self.batch[x] == self.batch[o]
                    if last[x] == t and x not in taken and not external[x] and same:
                        taken.add(x)
                        reused.append((x, o))
                        break
        self._life = (born, last, external, np.array(reused, dtype=int).reshape(-1, 2))
        return self._life

    def reads(self):
        """(events, buffers): two arrays pairing each event with each buffer it reads, once (computed once)."""
        if self._reads is None:
            pairs = [(t, b) for t, (_, used, _) in enumerate(self.events) for b in set(used)]
            self._reads = tuple(np.array([pair[i] for pair in pairs], dtype=int) for i in (0, 1))
        return self._reads

    def gradient_kernels(self):
        """(event, gradient buffers it makes, buffers it reads, once) of each backward kernel making weight gradients.

        Left out: a reduction whose gradient has the shape of what a reduction of the input gradient's path
        makes from a buffer it reads too (BatchNormalization's scale and offset gradients: the per-channel sums
        its input gradient needs). XLA:GPU fuses such sibling reductions into one kernel, which runs where the
        input gradient needs it. A kernel made from a float32 product a 16-bit norm's scale gradient sums
        (`widened`) reads that product too: XLA:GPU sums it with the weight gradients' reductions. A cast making
        a 16-bit gradient float32 is not the kernel: the product or sum it casts is (`gradient_waits.kernel_making`).
        """
        if self._gradient_kernels is None:
            start, born = self.bwd_start or 0, self.lifetimes()[0]
            reductions = [u for u in range(start, len(self.events)) if self.event_kinds[u] == "reduction"]
            self._gradient_kernels = []
            for t, (made, _, _) in enumerate(self.events[start:], start=start):
                grads = [g for g in made if self.term[g] == "gradients" and g in self.weight_of]
                if not grads:
                    continue
                t, grads = gradient_waits.kernel_making(self, t, grads, start, born)
                read = [u for u in self.events[t][1] if self.term[u] != "external"]
                read += self._widened_behind(read, grads[0], start, born)
                if self.event_kinds[t] == "reduction" and self._has_sibling(t, grads[0], read, reductions):
                    continue
                self._gradient_kernels.append((t, np.array(grads, dtype=int), np.unique(np.array(read, dtype=int))))
            self._gradient_kernels.sort(key=lambda kernel: kernel[0])
        return self._gradient_kernels

    def _widened_behind(self, read, grad, start, born):
        """The float32 products (`widened`) that backward kernels made `read` from, through values of as many
        elements as gradient `grad`: the product a 16-bit norm's scale gradient sums waits with its kernel."""
        if not self.widened:  # a float32 or CPU step: nothing to walk back to
            return []
        found, todo, seen, elements = [], list(read), set(), math.prod(self.shape[grad])
        while todo:
            u = todo.pop()
            if u in seen or born[u] < start or math.prod(self.shape[u]) != elements:
                continue
            seen.add(u)
            found += [w for w in self.events[born[u]][1] if w in self.widened]
            todo += self.events[born[u]][1]
        return found

    def _has_sibling(self, t, grad, read, reductions):
        """Whether another reduction reads one of the buffers reduction t reads into a backward value (not a
        gradient, nor its unreduced copy) of the gradient's shape, size-1 dimensions aside."""
        shape, read = _squeezed(self.shape[grad]), set(read)
        return any(
            u != t
            and read.intersection(self.events[u][1])
            and any(_squeezed(self.shape[m]) == shape and self.term[m] == "backward" for m in self.events[u][0])
            for u in reductions
        )

    def sweep(self, factor, last=None, born=None):
        """Live bytes after each event, per term ({term: array}), with each buffer's size times `factor`.

        `last` and `born` (default: the trace's): each buffer's last read and birth where a schedule moves kernels.
        """
        traced_born, traced_last, external, reused = self.lifetimes()
        born, last = traced_born if born is None else born, traced_last if last is None else last
        # a buffer read later than the kernel that would overwrite it runs (a schedule moved one) is not overwritten
        reused = reused[last[reused[:, 0]] == born[reused[:, 1]], 0]
        n_events = len(self.events)
        sizes = np.asarray(self.size, dtype=np.float64) * factor
        terms = np.array(self.term)
        curves = {}
        for term in TERMS:
            chosen = (terms == term) & (born >= 0) & ~external
            made, freed = np.zeros(n_events + 1), np.zeros(n_events + 1)
            np.add.at(made, born[chosen], sizes[chosen])
            np.add.at(freed, np.maximum(last[chosen], born[chosen]), sizes[chosen])
            r = reused[terms[reused] == term] if len(reused) else reused
            if len(r):  # written over by the kernel reading it last: gone before that kernel allocates
                np.add.at(freed, last[r], -sizes[r])
                np.add.at(made, last[r], -sizes[r])
            curves[term] = np.cumsum(made) - np.concatenate([[0.0], np.cumsum(freed)[:-1]])
        return curves

    def phase(self, t):
        """The part of the step event `t` belongs to: "forward", "backward" or "optimizer update"."""
        if t < (self.bwd_start or 0):
            return "forward"
        return "optimizer update" if t >= len(self.events) - 1 else "backward"


def _squeezed(shape):
    return tuple(d for d in shape if d != 1)


def _once(buffers):
    """`buffers` without repeats, in the order they come: the operands' order, which decides which of them an
    elementwise kernel writes over (`Step.lifetimes`), does not hang on how a set orders buffer numbers."""
    return tuple(dict.fromkeys(buffers))


def _made_forward(p, x):
    """Whether local id x is made by the forward part of program p (or is one of its inputs)."""
    return x not in p.producer_index or p.producer_index[x] < p.n_fwd
