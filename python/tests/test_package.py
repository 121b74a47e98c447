"""The installed package as a distribution: its name, version and type information."""

import importlib.metadata
import importlib.resources

import tidepool


def test_the_version_is_the_distributions():
    assert tidepool.__version__ == importlib.metadata.version("tidepool-memory")


def test_the_types_are_installed():
    files = importlib.resources.files("tidepool")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_tidepool.pyi").is_file()
