"""Train the MLP example (the same as `python -m jaxdnn.examples.train_mlp`); see --help."""

from jaxdnn.examples.train_mlp import main

if __name__ == "__main__":
    main()
