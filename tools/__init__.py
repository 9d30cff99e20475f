"""Tools people and tests run that no DVC stage runs; they use the library in pipeline/, never the other way round."""
