"""Few-shot classification with `select`: every label is scored on the shared, cached few-shot prefix."""

from _backend import setup

from frontend_lang import program, select

SHOTS = """Review: A masterpiece, I was moved to tears.
Sentiment: positive
Review: Two hours of my life I will never get back.
Sentiment: negative
Review: Brilliant acting and a clever plot.
Sentiment: positive
Review: Dull, predictable and far too long.
Sentiment: negative
"""


@program
def classify(s, review):
    s += SHOTS + "Review: " + review + "\nSentiment:"
    s += select("label", choices=[" positive", " negative"])


if __name__ == "__main__":
    setup(__doc__)
    reviews = ["I loved every minute of it.", "The worst film of the year.", "Charming, funny and warm."]
    for review, state in zip(reviews, classify.run_batch([{"review": r} for r in reviews])):
        print(f"{state['label'].strip():>8}  {review}")
