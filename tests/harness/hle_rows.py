"""A few HLE-shaped questions, as a user's jsonl file holds them."""

from __future__ import annotations

ROWS = [
    {
        "id": "q-math",
        "question": "What is the smallest prime number greater than 100?",
        "answer": "101",
        "answer_type": "exactMatch",
        "category": "Math",
        "image": "",
    },
    {
        "id": "q-chem",
        "question": (
            "Which gas is most abundant in Earth's atmosphere?\nAnswer Choices:\nA. Oxygen\nB. Nitrogen\nC. Argon"
        ),
        "answer": "B",
        "answer_type": "multipleChoice",
        "category": "Chemistry",
        "image": "",
    },
    {
        "id": "q-image",
        "question": "What is shown in the picture?",
        "answer": "a cat",
        "answer_type": "exactMatch",
        "category": "Other",
        "image": "data:image/png;base64,AAAA",
    },
]
