#!/bin/sh
# Every GPU figure of the performance docs, in one command (on a node with one GPU, hpcfl importable,
# Fashion-MNIST under $HPCFL_DATA or the default data root):
#   1. hpcfl against a plain PyTorch loop on the same GPU (one process; and 3 ranks sharing the GPU);
#   2. where hpcfl's GPU rounds spend their time (torch profiler, host waits for the device);
#   3. one worker's clients one after another vs trained together (train.batched_clients = 10);
#   4. W = 1, 2, 4, 8 worker ranks sharing the GPU: time per round, speed-up, efficiency;
#   5. channels_last against contiguous convolution weights on the GPU (run.memory_format = 'auto'
#      keeps a GPU contiguous until this says otherwise);
#   6. pooling before ReLU against the papers' order, and one client's loop against a bare loop.
# Each part runs even if the one before it failed; PYTHON names the interpreter (default python).
#     [REPEAT=4] sh bench/gpu.sh [ROUNDS]

cd "$(dirname "$0")/.."
rounds=${1:-5}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
"${PYTHON:-python}" bench/overhead.py --device cuda --rounds "$rounds" --ranks 3 --repeat "${REPEAT:-4}"
"${PYTHON:-python}" bench/overhead.py --device cuda --rounds 2 --profile
"${PYTHON:-python}" bench/batched.py --group 10
"${PYTHON:-python}" bench/scaling.py --workers 1,2,4,8 --rounds 4 --set "run.device='cuda'"
"${PYTHON:-python}" bench/memory_format.py --device cuda --models fmnist_cnn,fmnist_cnn_bn,lenet,tcnn,resnet18
"${PYTHON:-python}" bench/pool_order.py --device cuda
"${PYTHON:-python}" bench/local_step.py --device cuda
