"""specjax: exact speculative decoding for T5 encoder-decoder models in JAX."""

from setuptools import find_packages, setup

setup(
    name='specjax',
    version='0.1.0',
    description='Exact speculative decoding (Leviathan et al., ICML 2023) for T5 in JAX/Flax',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.10',
    packages=find_packages(include=['specjax', 'specjax.*']),
    install_requires=[
        'jax>=0.4.30',
        'flax>=0.8',
        'optax>=0.2',
        'orbax-checkpoint>=0.5',
        'transformers>=4.40',
        'huggingface-hub>=0.23',
        'ml-collections>=0.1.1',
        'absl-py>=1.0',
        'safetensors>=0.4',
        'sentencepiece>=0.2',
        'tokenizers>=0.19',
        'numpy>=1.24',
    ],
    extras_require={
        # torch: install the CPU build first (pip install torch==2.13.0) or pip pulls a CUDA build.
        'test': ['pytest>=8', 'pytest-xdist>=3', 'chex>=0.1.86', 'scipy>=1.11', 'torch>=2.1'],
    },
)
