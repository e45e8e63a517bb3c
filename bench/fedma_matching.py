"""FedMA's server matching time per layer: VGG-9 (CIFAR-10 shapes) with 16 clients on the CPU, one
layer-wise pass without retraining, through the algorithm's hooks in the order the runtime calls them
(gather -> match -> install), with BBP-MAP's defaults (sigma = sigma0 = 1, gamma = 7). Two kinds of
client models:

- `independent`: independent random initialisations, the paper's realistic start;
- `related`: one random network with its hidden units permuted per client plus noise (sd 0.01 of each
  tensor's scale). Untrained weights are small against the prior's unit variance, so even these
  match back only in part: the Indian buffet prior still adds a few neurons per client.

    python bench/fedma_matching.py [--clients 16] [--model vgg9] [--threads 1]
    python bench/fedma_matching.py --smoke        # 2 clients of LeNet: checks that the bench runs (CI)
"""
import argparse
import time

import numpy as np
import torch

from hpcfl import MATCHED, Client, Setup
from hpcfl.algorithms import ALGORITHMS, algorithm_params
from hpcfl.algorithms.neurons import chain, place, place_inputs, width
from hpcfl.jobs import job_from_dict
from hpcfl.models import build_model

SHAPE, CLASSES = (3, 32, 32), 10


def client_models(template, name: str, clients: int, related: bool) -> list[dict]:
    states = []
    for cid in range(clients):
        torch.manual_seed(cid)
        if not related:
            states.append(dict(build_model(name, SHAPE, CLASSES).state_dict()))
            continue
        state, layers = dict(template.state_dict()), chain(template)
        for i, layer in enumerate(layers[:-1]):
            n = width(state, layer)
            perm = torch.randperm(n)
            state = place_inputs(place(state, layer, perm, n), layers[i + 1], perm, n, n)
        states.append({k: v + 0.01 * v.std() * torch.randn_like(v) for k, v in state.items()})
    return states


def match_once(template, states: list[dict]) -> tuple[dict, dict]:
    """One one-shot FedMA pass; returns the server's matching seconds and the global width per layer."""
    n = len(states)
    job = job_from_dict({"algorithm": {"name": "fedma", "params": {"retrain": False}},
                         "data": {"num_clients": n}, "train": {"clients_per_round": n}})
    algorithm = ALGORITHMS["fedma"](algorithm_params("fedma", {"retrain": False}),
                                    Setup.of(job, template, np.ones((n, CLASSES), dtype=np.int64)))
    clients = []
    for cid, state in enumerate(states):
        clients.append(Client(cid, torch.zeros(0), torch.zeros(0, dtype=torch.long), np.ones(CLASSES)))
        clients[-1].state = {"model": dict(state)}
    server_state = algorithm.init_server_state(template)
    for phase in algorithm.plan(0)[1:]:
        gathered = {c.id: algorithm.gather_out(phase, 0, c).double() for c in clients}
        shared, replies = algorithm.match(phase, 0, server_state, gathered)
        for c in clients:
            algorithm.client_update(phase, 0, c, {MATCHED: {"global": shared, "reply": replies[c.id]}},
                                    algorithm.client_model(c, template), None)
    widths = {layer.name: w for layer, w in zip(algorithm.layers, algorithm.widths, strict=True)}
    return algorithm.match_s, widths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--model", default="vgg9")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="2 clients of LeNet: checks that the bench runs")
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.model = 2, "lenet"
    torch.set_num_threads(args.threads)
    torch.manual_seed(100)
    template = build_model(args.model, SHAPE, CLASSES)
    print(f"{args.model}, {args.clients} clients, {args.threads} thread(s): server matching s per layer (global width)")
    for kind in ("independent", "related"):
        start = time.perf_counter()
        seconds, widths = match_once(template, client_models(template, args.model, args.clients, kind == "related"))
        print(f"{kind:>12}: " + ", ".join(f"{k} {s:.2f} s ({widths.get(k, '-')})" for k, s in seconds.items()) +
              f"; pass total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
