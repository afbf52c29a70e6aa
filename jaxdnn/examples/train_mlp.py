"""Train the example MLP on jaxdnn's primitives: `python -m jaxdnn.examples.train_mlp --help`."""

from .train import main as _main


def main(argv=None):
    return _main("mlp", argv)


if __name__ == "__main__":
    main()
