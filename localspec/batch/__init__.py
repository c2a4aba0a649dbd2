"""Many prompts at once: requests in, results out, every target pass shared by the sequences in flight.

``request`` / ``result`` are the plain data a job is made of; ``scheduler`` (speculative/scheduler.py) runs them;
``files`` reads and writes `localspec batch` files; ``run`` turns requests into results; ``api`` is the Python face
(``localspec.generate_many``).
"""
