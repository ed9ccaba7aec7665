// End-of-chapter checks (book/_ext/quiz.py): clicking an option, or pressing Enter or Space on it,
// marks it right or wrong and unfolds its own explanation; the others stay as they were.
document.addEventListener("DOMContentLoaded", () => {
  for (const option of document.querySelectorAll(".quiz-option")) {
    const answer = option.querySelector(".quiz-answer");
    answer.setAttribute("role", "button");
    answer.setAttribute("tabindex", "0");
    answer.setAttribute("aria-expanded", "false");
    const pick = () => {
      option.classList.add("quiz-picked");
      answer.setAttribute("aria-expanded", "true");
    };
    answer.addEventListener("click", pick);
    answer.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        pick();
      }
    });
  }
});
