#!/bin/sh
# Every GPU figure of the performance docs, in one command (on a node with one GPU, hpcfl importable,
# Fashion-MNIST under $HPCFL_DATA or the default data root):
#   1. hpcfl against a plain PyTorch loop on the same GPU (one process; and 3 ranks sharing the GPU);
#   2. where hpcfl's GPU rounds spend their time (torch profiler, host waits for the device);
#   3. each method's clients one after another vs trained together (train.batched_clients), together
#      with each step a CUDA graph (train.cuda_graphs), and one after another under bf16, and
#      FedFM's ResNet-18 regime on CIFAR-shaped images, projected to its 100 rounds of E = 10;
#   4. W = 1, 2, 4, 8 worker ranks sharing the GPU: time per round, speed-up, efficiency;
#   5. channels_last against contiguous convolution weights on the GPU (run.memory_format = 'auto'
#      keeps a GPU contiguous until this says otherwise).
# Each part runs even if the one before it failed; PYTHON names the interpreter (default python). Every
# part's output goes to OUT/<part>.txt as well as the terminal (batched: also OUT/batched.md and .json).
#     [REPEAT=4] sh bench/gpu.sh OUT [ROUNDS]

cd "$(dirname "$0")/.."
out=${1:?usage: sh bench/gpu.sh OUT [ROUNDS]}
rounds=${2:-5}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
py=${PYTHON:-python}
$py bench/batched.py --device cuda --rounds 2 --repeat 1 --out "$out" \
    --cases fedavg,fedfm-cg,fedcme,fedka,fedclassavg,moon,scaffold 2>&1 | tee "$out/batched.txt"
$py bench/batched.py --device cuda --rounds 2 --repeat 1 --out "$out/resnet18" --cases resnet18-fedfm 2>&1 \
    | tee "$out/batched-resnet18.txt"
$py bench/overhead.py --device cuda --rounds "$rounds" --ranks 3 --repeat "${REPEAT:-4}" 2>&1 | tee "$out/overhead.txt"
$py bench/overhead.py --device cuda --rounds 2 --profile 2>&1 | tee "$out/profile.txt"
$py bench/scaling.py --workers 1,2,4,8 --rounds 4 --set "run.device='cuda'" 2>&1 | tee "$out/scaling.txt"
$py bench/memory_format.py --device cuda --models fmnist_cnn,fmnist_cnn_bn,lenet,tcnn,resnet18 2>&1 \
    | tee "$out/memory_format.txt"
