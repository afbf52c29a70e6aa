"""Train the CNN example (the same as `python -m jaxdnn.examples.train_cnn`); see --help."""

from jaxdnn.examples.train_cnn import main

if __name__ == "__main__":
    main()
