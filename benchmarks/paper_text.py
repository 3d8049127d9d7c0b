"""Deterministic, English-looking text for the paper workloads (benchmarks/paper_workloads.py).

Nothing is downloaded: sentences are put together from small word lists with a seeded
random.Random, so every peer sees the same prompts and a rerun sees the same ones again. The
text is made to tokenize like prose (ordinary words, punctuation, numbers, names), which random
words from a list do not: a tokenizer splits made-up strings into more pieces than real prose.
"""

from __future__ import annotations

import random

SUBJECTS = ["The committee", "A small village near the coast", "The chief engineer", "Most farmers in the valley",
            "The old railway company", "A team of researchers", "The city council", "Local fishermen",
            "The museum's director", "Several merchants from the north", "The regional hospital", "A young teacher",
            "The shipping firm", "The university library", "Two rival families", "The new mayor"]
VERBS = ["decided to rebuild", "carefully studied", "quietly replaced", "openly criticised", "slowly expanded",
         "began to export", "agreed to protect", "managed to repair", "refused to sell", "helped to design",
         "learned to measure", "promised to improve"]
OBJECTS = ["the stone bridge over the river", "the harbour walls", "the annual grain harvest", "a network of canals",
           "the records of the old mill", "the northern trade route", "the water supply of the town",
           "a collection of maps", "the wooden houses by the market", "the schools of the district",
           "the copper mines in the hills", "the lighthouse on the cape"]
CLAUSES = ["after a long and difficult winter", "because prices had risen sharply", "with help from the province",
           "before the spring floods arrived", "although many people disagreed", "during the years of the war",
           "in less than three months", "at a cost of nearly {n} silver coins", "to the surprise of the visitors",
           "while the population grew to {n} people", "as the newspapers reported in {y}",
           "under the guidance of an experienced architect"]
TOPICS = ["geography", "economics", "biology", "world history", "chemistry", "astronomy", "law", "medicine"]
CITY_PARTS = ["Port", "Lake", "North", "Saint", "New", "Old", "East", "Fort"]
CITY_ROOTS = ["Haven", "Marlow", "Brenton", "Calder", "Ashby", "Dunmore", "Ellery", "Farrow", "Greywick", "Holloway",
              "Ivel", "Kestrel", "Lindon", "Morrow", "Norwick", "Orton"]
COUNTRIES = ["Norland", "Valdoria", "Estmark", "Corvania", "Belmare", "Ostria"]
INDUSTRIES = ["fishing", "mining", "tourism", "farming", "shipping", "software"]
LANDMARKS = ["clock tower", "stone bridge", "old harbour", "botanical garden", "cathedral", "city wall",
             "lighthouse", "royal palace", "opera house", "salt market"]


def sentence(rng: random.Random) -> str:
    clause = rng.choice(CLAUSES).format(n=rng.randint(200, 90000), y=rng.randint(1820, 2010))
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {clause}."


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def short_phrase(rng: random.Random) -> str:
    """A multiple-choice option or an ending: a verb phrase of a few words."""
    return f"{rng.choice(VERBS)} {rng.choice(OBJECTS)}"


def city(rng: random.Random) -> str:
    return f"{rng.choice(CITY_PARTS)} {rng.choice(CITY_ROOTS)}"


def city_record(rng: random.Random) -> dict[str, object]:
    """The facts a JSON-extraction document states, so the document and the schema agree."""
    return {"city_name": city(rng), "country": rng.choice(COUNTRIES), "founded_year": rng.randint(1100, 1950),
            "population": rng.randint(2000, 900000), "main_industry": rng.choice(INDUSTRIES),
            "has_university": rng.random() < 0.5, "landmarks": rng.sample(LANDMARKS, 2)}


def city_document(rng: random.Random, record: dict[str, object], filler: int = 3) -> str:
    """A short encyclopedia-style article stating the record's facts among ordinary sentences."""
    uni = "has a small university" if record["has_university"] else "has no university"
    facts = (f"{record['city_name']} is a town in {record['country']}, founded in {record['founded_year']}. "
             f"About {record['population']} people live there today, and most of them work in "
             f"{record['main_industry']}. The town {uni}. Visitors come to see the "
             f"{record['landmarks'][0]} and the {record['landmarks'][1]}.")
    return f"{facts} {paragraph(rng, filler)}"
