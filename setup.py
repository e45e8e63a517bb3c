"""hpcfl: federated-learning experiments on HPC clusters (MPI, rank 0 = server)."""
from setuptools import find_packages, setup

setup(
    name="hpcfl",
    version="0.2.0",
    description="Federated-learning experiment runner for HPC clusters (MPI collectives, HDF5 results)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["hpcfl", "hpcfl.*"]),
    install_requires=[
        "numpy>=1.24",
        "torch>=2.1",
        "torchvision>=0.16",
        "mpi4py>=3.1",
        "h5py>=3.8",
        "scipy>=1.10",
        "scikit-learn>=1.3",
        "matplotlib>=3.7",
        "pandas>=2.0",
    ],
    extras_require={
        # The PyPI MPICH wheel: mpirun + libmpi, so `pip install` is the whole set-up.
        # Leave it out on a cluster and build mpi4py against the site MPI instead.
        "mpi": ["mpich>=4.1"],
        "test": ["pytest>=7", "pytest-mpi>=0.6", "pytest-timeout>=2.1", "hypothesis>=6"],
    },
)
