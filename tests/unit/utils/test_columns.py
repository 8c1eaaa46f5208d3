"""`utils.columns`: which tensors are the adjacent column slices of one buffer, and their join as a view of it
(no copy) where they are, a concatenation where they are not."""

import torch

from nemo_jetrl.utils.columns import adjacent_columns, column_buffer, join_columns


def test_column_views_of_one_buffer_join_as_that_buffer():
    y = torch.randn(2, 5, 12)
    parts = y.split([4, 2, 6], -1)
    assert adjacent_columns(parts)
    joined = join_columns(parts)
    assert joined.data_ptr() == y.data_ptr() and joined.stride() == y.stride() and torch.equal(joined, y)


def test_anything_else_is_concatenated():
    y = torch.randn(2, 5, 12)
    a, b, c = y.split([4, 4, 4], -1)
    cases = [
        (b, a),  # out of order
        (a, c),  # a gap
        y.transpose(0, 1).split([6, 6], -1),  # leading dims not dense over the joined width
        (torch.randn(2, 5, 4), torch.randn(2, 5, 4)),  # two buffers
        (torch.zeros(1, 4).expand(3, 4),) * 2,  # broadcast rows (stride 0)
        (a, b.double()),  # dtypes differ
    ]
    for parts in cases:
        assert not adjacent_columns(parts)
    for parts in cases[:5]:
        joined = join_columns(parts)
        assert torch.equal(joined, torch.cat(parts, -1))
        assert all(joined.data_ptr() != p.data_ptr() for p in parts)  # a fresh copy


def test_column_buffer_hands_out_adjacent_slices():
    g, u = column_buffer(torch.empty(3, 7, 5, dtype=torch.bfloat16), (5, 5))
    assert g.shape == u.shape == (3, 7, 5) and g.dtype == torch.bfloat16 and g.stride() == (70, 10, 1)
    assert adjacent_columns((g, u)) and join_columns((g, u)).shape == (3, 7, 10)
