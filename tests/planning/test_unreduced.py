"""A weight's gradient before its reduction over fsdp: whole, or a lookup table's by rows where XLA makes it so."""

import keras
import pytest

import kdist
from kdist.planning.memory_model import PlacedVariable
from kdist.planning.unreduced import scatters_by_rows
from tests.helpers import step_buffers


def _table(rows, width):
    return PlacedVariable("trainable", (rows, width), "float32", ("fsdp", None), 0, 1)


@pytest.mark.parametrize(
    "rows,width,cotangents,fsdp,by_rows",
    [
        (256_000, 2048, 4 * 512 * 2048, 2, True),  # Gemma-2B's widths, 32 x 512 tokens on data=4,fsdp=2
        (4096, 256, 32 * 128 * 256, 8, False),  # 256 examples of 128 tokens on fsdp=8: into the whole table
        (4096, 256, 2 * 128 * 256, 8, True),  # 16 of them: into the device's 512 rows
    ],
)
def test_the_scatter_is_by_rows_where_xla_compiled_it_so(rows, width, cotangents, fsdp, by_rows):
    """The cases XLA:GPU's deviceless compiles showed (docs/plan.md, "A lookup table's gradient over fsdp")."""
    assert scatters_by_rows(_table(rows, width), cotangents * 4, fsdp) is by_rows


def test_a_table_split_by_rows_over_fsdp_gets_its_gradient_by_rows_while_that_holds_fewer_bytes():
    """XLA's partitioner scatters a lookup table's gradient into each device's rows from its fsdp group's gathered
    cotangents, unless those hold more than two whole tables; then into a whole table, reduce-scattered after."""
    vocabulary, width = 65_536, 64

    def build():
        tokens = keras.Input((8,), dtype="int32")
        pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(vocabulary, width)(tokens))
        return keras.Model(tokens, keras.layers.Dense(4)(pooled))

    model, table = kdist.abstract_model(build), vocabulary * width * 4
    few, many = (kdist.plan(model, 8, batch_size=b).candidate("fsdp=8") for b in (16, 16_384))
    assert step_buffers(few) < table / 2  # the device's eighth of the gradient, the group's 16 x 8 cotangents
    # a whole gradient and the device's own cotangents: gathered, 16,384 x 8 of 64 floats would be 2 tables
    assert table < step_buffers(many) < 2 * table
