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
    # The offline corpus, its tokenizer and the shipped tiny model pair travel with the package.
    # The CPU decode kernels' C++ source is compiled on the user's machine at first use.
    package_data={'specjax': ['assets/*/*', 'assets/*/*/*', 'models/*.cc']},
    # Compatible ranges; the exact versions the published figures were measured with are in
    # requirements/lock.txt (scripts/refresh_lock.sh). Upper bounds: jax and flax change APIs and
    # CPU timings between minor releases before 1.0, so they stop above the newest minor tested
    # (jax 0.10 on CPU, 0.11 on GPU; flax 0.12); transformers and numpy at the next major.
    install_requires=[
        'jax>=0.4.30,<0.12',
        'flax>=0.8,<0.13',
        'optax>=0.2',
        'orbax-checkpoint>=0.5',
        'transformers>=4.40,<6',
        'huggingface-hub>=0.23',
        'ml-collections>=0.1.1',
        'absl-py>=1.0',
        'safetensors>=0.4',
        'sentencepiece>=0.2',
        'tokenizers>=0.19',
        'numpy>=1.24,<3',
        'sacrebleu>=2.3',
        'rouge-score>=0.1.2',
        'matplotlib>=3.7',
        'tqdm>=4.60',
    ],
    extras_require={
        # torch: install the CPU build first (pip install torch==2.13.0) or pip pulls a CUDA build.
        'test': ['pytest>=8', 'pytest-xdist>=3', 'pytest-timeout>=2.3', 'chex>=0.1.86', 'scipy>=1.11', 'torch>=2.1,<3',
                 'nbformat>=5.9', 'nbclient>=0.9', 'ipykernel>=6', 'nbconvert>=7'],
        # The CPU peer of experiments/bench_transformers.py (CTranslate2's own converter and
        # decoder on the same weights); the tests check its tokens against specjax's.
        'bench': ['ctranslate2>=4.4,<5'],
        # WMT14 / CNN-DM through Hugging Face datasets at run time (the paper's tasks).
        'data': ['datasets>=2.14'],
        # Rebuilding the shipped Bible corpus from Debian's SWORD packages.
        'corpus': ['pysword>=0.2.8'],
    },
)
