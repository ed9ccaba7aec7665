"""Teaching aids the lab notebooks use and no check needs.

- :mod:`~labkit.labs.aids.measure`: timing, this machine's two rates, tokens/s against batch size;
- :mod:`~labkit.labs.aids.capacity_widget`: how many conversations fit, with sliders (lab 2);
- :mod:`~labkit.labs.aids.padded_cache`: the KV cache of a static batch, pads included (lab 3).
"""
