"""Models: the store of embedded and local models (`store`) and the backends that run them."""
