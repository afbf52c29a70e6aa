"""Train the example CNN on jaxdnn's primitives: `python -m jaxdnn.examples.train_cnn --help`."""

from .train import main as _main


def main(argv=None):
    return _main("cnn", argv)


if __name__ == "__main__":
    main()
