"""Feature-space quality of a final global model (FedFM, Table IV): how well the features of a test
sample separate the classes. NMI compares K-means clusters (K = number of classes in the sample) with the labels;
the silhouette score measures, with the true labels as clusters, how much closer each feature lies
to its own class than to the nearest other class (cosine distance would hide the scale; we use the
Euclidean distance that scikit-learn defaults to). Both are in [-1, 1] (NMI in [0, 1]); higher is
better."""
import numpy as np
import torch

from hpcfl.seeding import numpy_rng


@torch.no_grad()
def feature_quality(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, seed: int,
                    samples: int = 2000, batch_size: int = 1000) -> dict[str, float]:
    from sklearn.cluster import KMeans  # here: importing scikit-learn costs every run 0.8 s of start-up
    from sklearn.metrics import normalized_mutual_info_score, silhouette_score

    pick = torch.from_numpy(np.sort(numpy_rng(seed, "feature_space").choice(len(y), min(samples, len(y)),
                                                                            replace=False))).to(y.device)
    model.eval()
    features = torch.cat([model.features(x[pick[s:s + batch_size]]) for s in range(0, len(pick), batch_size)])
    features, labels = features.double().cpu().numpy(), y[pick].cpu().numpy()
    if not np.isfinite(features).all():           # a diverged model: nothing to cluster, but no crash
        return {"feature_nmi": float("nan"), "feature_silhouette": float("nan")}
    present = len(set(labels.tolist()))           # a small test set may not hold every class
    clusters = KMeans(n_clusters=min(num_classes, present), n_init=10, random_state=seed).fit_predict(features)
    return {"feature_nmi": float(normalized_mutual_info_score(labels, clusters)),
            "feature_silhouette": float(silhouette_score(features, labels)) if len(set(labels)) > 1 else float("nan")}
