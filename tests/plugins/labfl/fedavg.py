"""FedAvg from the contract alone (docs/how-to/write-your-own-algorithm.md walks through it), and a stateful
variant whose clients remember their last update between rounds."""
from dataclasses import dataclass

from hpcfl import ONE, WEIGHT, Algorithm, Phase, Traits, assign, weighted, weighted_mean


class MyFedAvg(Algorithm):
    name = "my_fedavg"
    traits = Traits(stateless=True)       # clients keep nothing between rounds: any worker may train any

    def __init__(self, params, setup):
        super().__init__(params, setup)
        model = setup.model_layout        # the state_dict's names and shapes
        self.phase = Phase("train", downlink={"model": model}, uplink={"model": weighted(model)})

    def plan(self, round):                # a round is one phase: send the model, train, average
        return [self.phase]

    def downlink(self, phase, round, server_state):              # server: what every client receives
        return {"model": self.global_state(server_state)}

    def client_update(self, phase, round, client, downlink, model, trainer):   # the client's worker
        self.start_from(model, client, downlink["model"])
        metrics = self.train(model, client, round, trainer, downlink)          # E epochs, the job's terms
        contribution = ({**model.state_dict(), WEIGHT: ONE}, float(client.num_samples))
        return {"model": contribution}, metrics             # summed over clients as weight * tensors

    def aggregate(self, phase, round, server_state, uplink):     # server: the sums of every contribution
        mean = weighted_mean(uplink["model"])                    # divided by the summed WEIGHT
        if mean is not None:                                     # None: no client trained this round
            assign(server_state["model"], mean)


class ClientMemory(MyFedAvg):
    """Each client adds `beta` times its previous round's update to this round's (a client-side
    momentum across rounds): state that stays with the client on its worker."""
    name = "client_memory"
    traits = Traits()                     # it keeps client.state (`stateless` is never inherited anyway)

    @dataclass(frozen=True)
    class Params:
        beta: float = 0.5

    def init_client_state(self, client, initial_model):
        return {}                         # no update yet: the first round is plain FedAvg

    def client_update(self, phase, round, client, downlink, model, trainer):
        self.start_from(model, client, downlink["model"])
        metrics = self.train(model, client, round, trainer, downlink)
        trained = model.state_dict()
        update = {n: trained[n] - downlink["model"][n] for n in self.setup.parameter_names}
        sent = dict(trained)
        for n, previous in client.state.get("update", {}).items():     # none before its first round
            sent[n] = trained[n] + self.params.beta * previous.to(trained[n].device)
        client.state["update"] = {n: delta.detach().cpu() for n, delta in update.items()}
        return {"model": ({**sent, WEIGHT: ONE}, float(client.num_samples))}, metrics
