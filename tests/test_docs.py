"""The documentation that is generated from code stays in sync with it."""
from pathlib import Path

from rmq_source.spark.options import OPTION_DOCS, options_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_options_reference_matches_the_parser():
    text = (DOCS / "options.md").read_text(encoding="utf-8")
    assert options_markdown() in text, "regenerate docs/options.md from rmq_source.spark.options"
    for name in OPTION_DOCS:
        assert f"`{name}`" in text


def test_sink_options_reference_matches_the_parser():
    from rmq_source.sink.options import SINK_OPTION_DOCS
    text = (DOCS / "sink.md").read_text(encoding="utf-8")
    assert options_markdown(SINK_OPTION_DOCS) in text, "regenerate the table of docs/sink.md"


def test_every_error_class_is_documented():
    import rmq_source.errors as errors
    text = (DOCS / "errors.md").read_text(encoding="utf-8")
    classes = [n for n, v in vars(errors).items()
               if isinstance(v, type) and issubclass(v, errors.RmqSourceError)]
    missing = [n for n in classes if f"`{n}`" not in text]
    assert not missing, f"docs/errors.md does not cover {missing}"
