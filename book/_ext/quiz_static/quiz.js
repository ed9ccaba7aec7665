// End-of-chapter checks (book/_ext/quiz.py): clicking an option, or pressing Enter or Space on it,
// marks it right or wrong and unfolds its own explanation; the others stay as they were. The markup does not
// say which option is right: the box's classes hold a salt and the right position scrambled with it (quiz.py's
// scramble, repeated here). The first pick of each check is its score; "Try again" folds the options back.
// For printing, every explanation unfolds with its verdict.
const MODULUS = 101;
const classNumber = (element, prefix) =>
  Number([...element.classList].find((name) => name.startsWith(prefix)).slice(prefix.length));

function isRight(box, position) {
  return (position * 37 + classNumber(box, "quiz-salt-")) % MODULUS === classNumber(box, "quiz-key-");
}

function mark(option, right) {
  option.classList.add(right ? "quiz-right" : "quiz-wrong");
  const explanation = option.querySelector(".quiz-explanation");
  if (!explanation.querySelector(".quiz-verdict")) {
    const verdict = document.createElement("strong");
    verdict.className = "quiz-verdict";
    verdict.textContent = right ? "Right. " : "Not this one. ";
    (explanation.querySelector("p") || explanation).prepend(verdict);
  }
}

function unmark(option) {
  option.classList.remove("quiz-right", "quiz-wrong", "quiz-picked");
  option.querySelector(".quiz-verdict")?.remove();
  option.querySelector(".quiz-answer").setAttribute("aria-expanded", "false");
}

function showScore() {
  const boxes = [...document.querySelectorAll(".quiz")];
  const tried = boxes.filter((box) => box.dataset.first);
  const right = tried.filter((box) => box.dataset.first === "right").length;
  for (const box of boxes) {
    box.querySelector(".quiz-score").textContent = !box.dataset.first ? ""
      : `${box.dataset.first === "right" ? "Right" : "Not right"} at the first try` +
        (boxes.length > 1 ? ` (this page: ${right} of ${tried.length} tried)` : "") + ".";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const box of document.querySelectorAll(".quiz")) {
    const options = [...box.querySelectorAll(".quiz-option")];
    const footer = document.createElement("div");
    footer.className = "quiz-footer";
    footer.innerHTML = '<span class="quiz-score" aria-live="polite"></span> <button type="button" class="quiz-retry">Try again</button>';
    box.append(footer);
    footer.querySelector(".quiz-retry").addEventListener("click", () => options.forEach(unmark));
    options.forEach((option, position) => {
      const answer = option.querySelector(".quiz-answer");
      answer.setAttribute("role", "button");
      answer.setAttribute("tabindex", "0");
      answer.setAttribute("aria-expanded", "false");
      const pick = () => {
        const right = isRight(box, position);
        mark(option, right);
        option.classList.add("quiz-picked");
        answer.setAttribute("aria-expanded", "true");
        if (!box.dataset.first) {
          box.dataset.first = right ? "right" : "wrong";
          showScore();
        }
      };
      answer.addEventListener("click", pick);
      answer.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          pick();
        }
      });
    });
  }
});

window.addEventListener("beforeprint", () => {
  for (const box of document.querySelectorAll(".quiz")) {
    box.querySelectorAll(".quiz-option").forEach((option, position) => mark(option, isRight(box, position)));
  }
});
window.addEventListener("afterprint", () => {
  document.querySelectorAll(".quiz-option:not(.quiz-picked)").forEach(unmark);
});
