"""Build and install rmq_source; the C core is compiled by cffi (native/_build.py)."""
from setuptools import find_packages, setup

setup(
    name="rmq_source",
    version="0.1.0",
    description="PySpark data source reading Apache RocketMQ topics straight from broker store directories",
    python_requires=">=3.11",
    packages=find_packages(include=["rmq_source", "rmq_source.*"]),
    setup_requires=["cffi>=1.16"],
    cffi_modules=["native/_build.py:ffi"],
    install_requires=[
        "cffi>=1.16",
        "pyarrow>=15",
        "numpy>=1.24",
        "tqdm>=4.60",
    ],
    extras_require={
        "spark": ["pyspark==4.3.*", "pandas>=2,<3", "numpy"],
        "compression": ["lz4>=4", "zstandard>=0.22"],
        "bench": ["pyspark==4.3.*", "pandas>=2,<3", "matplotlib", "lz4>=4", "zstandard>=0.22"],
        "test": [
            "pyspark==4.3.*", "pandas>=2,<3", "numpy", "lz4>=4", "zstandard>=0.22",
            "pytest>=8", "chispa>=0.10", "hypothesis>=6", "pytest-timeout", "pytest-xdist>=3",
            # reruns only what Spark's fixed 10 s Python worker connect-back fails (pyproject.toml)
            "pytest-rerunfailures>=14",
            # the bounded fuzz run of the C core (tests/test_fuzz.py) is part of the suite
            "atheris>=2.3; platform_system == 'Linux'",
        ],
    },
    entry_points={"console_scripts": ["rmq-store=rmq_source.cli:main"]},
)
