"""A client record: its inputs as the model takes them (uint8 pixels normalised per batch, never in
place), and the state it keeps from round to round, by part and owner."""
import numpy as np
import torch

from hpcfl.data.client import Client


def _client(**kwargs):
    return Client(3, torch.tensor([[0, 51], [102, 255]], dtype=torch.uint8), torch.tensor([1, 0]), np.array([1, 1]),
                  **kwargs)


def test_pixels_are_normalised_as_they_are_taken_and_stay_pixels():
    client = _client(normalization=(torch.tensor(1 / 51), torch.tensor(2.0)))
    torch.testing.assert_close(client.inputs(), torch.tensor([[-2.0, -1.0], [0.0, 3.0]]))
    torch.testing.assert_close(client.inputs(torch.tensor([1])), torch.tensor([[0.0, 3.0]]))
    assert client.x.dtype == torch.uint8 and client.x.tolist() == [[0, 51], [102, 255]]      # untouched
    assert client.num_samples == 2


def test_inputs_without_normalisation_are_the_stored_rows():
    client = _client()
    assert client.inputs() is client.x
    assert client.inputs(torch.tensor([1, 0])).tolist() == [[102, 255], [0, 51]]


def test_the_kept_state_leaves_out_empty_owners_and_is_taken_back_by_owner():
    c, prev = torch.zeros(2), torch.ones(1)
    client = _client(state={"scaffold": {"c": c}, "bn": {}}, term_state={"moon": {"prev": prev}})
    kept = client.kept()
    assert kept == {"algorithm": {"scaffold": {"c": c}}, "terms": {"moon": {"prev": prev}}}
    other = _client()
    other.keep(kept)
    kept["algorithm"]["scaffold"]["d"] = torch.zeros(1)          # the kept tables stay the caller's
    assert other.state == {"scaffold": {"c": c}} and other.term_state == {"moon": {"prev": prev}}
    assert other.state["scaffold"]["c"] is c                       # the tensors themselves are taken


def test_a_new_client_has_no_architecture_held_out_sets_test_set_or_shared_set():
    client = _client()
    assert (client.architecture, client.eval_sets, client.test_set, client.shared) == ("", {}, None, None)
    assert client.state == {} and client.term_state == {} and client.normalization is None


def test_normalised_inputs_are_never_the_stored_tensor_even_when_it_is_float_already():
    client = Client(0, torch.tensor([[1.0, 2.0]]), torch.tensor([0]), np.array([1]),
                    normalization=(torch.tensor(2.0), torch.tensor(1.0)))
    assert client.inputs().tolist() == [[1.0, 3.0]] and client.x.tolist() == [[1.0, 2.0]]
