"""`localspec serve`: the OpenAI API over the batch scheduler (protocol → app → service → scheduler).

Needs the ``serve`` extra (Starlette, uvicorn): ``pip install 'localspec[serve]'``.
"""
