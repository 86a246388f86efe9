# lets tests import the top-level modules (model, rope, train, data) from the repository root
