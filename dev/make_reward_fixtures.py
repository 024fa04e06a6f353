#!/usr/bin/env python3
"""Labels the reward test table (test/fixtures/reward/cases.jsonl) with independent verifiers.

The reference verifiers below are Python ports of the public ones, using Python's own `re`,
str methods and `ast`, so the expected values do not come from fp8rl's C++:
  * gsm8k, gsm8k_flexible: verl utils/reward_score/gsm8k.py (last 300 characters, spec-rl.md §9.1);
  * math: verl utils/reward_score/math_reward.py (lm-eval's Hendrycks strip_string), plus
    fp8rl's exact numeric rule (spec: "equivalence including numeric comparison") via fractions;
  * dapo: verl utils/reward_score/math_dapo.py (Minerva "Answer:" then \\boxed{} fallback);
  * countdown: TinyZero's countdown.py extraction and scores, with the expression checked by
    Python's `ast` parser and evaluated with fractions instead of eval();
  * add/reverse/sort/copy: exact match of the response's stripped first line (rl/tasks/tasks.h).
Rerun: python3 dev/make_reward_fixtures.py
"""
import ast
import json
import os
import re
from fractions import Fraction

# ----------------------------------------------------------------------------- gsm8k (verl)


def gsm8k(response, answer, flexible):
    text = response[-300:]
    if flexible:
        found = re.findall(r"(\-?[0-9\.\,]+)", text)
        if not found:
            return 0.0, None
        pred = found[0]
        for cand in reversed(found):
            if cand not in ("", "."):
                pred = cand
                break
    else:
        found = re.findall(r"#### (\-?[0-9\.\,]+)", text)
        if not found:
            return 0.0, None
        pred = found[-1].replace(",", "").replace("$", "")
    return (1.0 if pred == answer else 0.0), pred


# ----------------------------------------------------------------------------- math (verl / lm-eval)


def last_boxed_only_string(string):
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    depth, end = 0, None
    for i in range(idx, len(string)):
        if string[i] == "{":
            depth += 1
        if string[i] == "}":
            depth -= 1
            if depth == 0:
                end = i
                break
    return None if end is None else string[idx : end + 1]


def remove_boxed(s):
    if "\\boxed " in s:
        assert s.startswith("\\boxed ")
        return s[len("\\boxed ") :]
    assert s.startswith("\\boxed{") and s.endswith("}")
    return s[len("\\boxed{") : -1]


def fix_fracs(string):
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[0] == "{":
            out += part
        else:
            if len(part) < 2:
                return string
            a, b = part[0], part[1]
            out += ("{" + a + "}{" + b + "}" + part[2:]) if b != "{" else ("{" + a + "}" + b + part[2:])
    return out


def fix_a_slash_b(string):
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        a, b = int(a), int(b)
        assert string == "{}/{}".format(a, b)
        return "\\frac{" + str(a) + "}{" + str(b) + "}"
    except Exception:
        return string


def remove_right_units(string):
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        assert len(splits) == 2
        return splits[0]
    return string


def fix_sqrt(string):
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    out = splits[0]
    for split in splits[1:]:
        out += ("\\sqrt{" + split[0] + "}" + split[1:]) if split[0] != "{" else ("\\sqrt" + split)
    return out


def strip_string(string):
    string = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = remove_right_units(string)
    string = string.replace("\\\\%", "").replace("\\%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = fix_sqrt(string)
    string = string.replace(" ", "")
    string = fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return fix_a_slash_b(string)


NUMBER = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+(?:\.[0-9]+)?)"


def exact_value(s):
    """fp8rl's numeric reading of a stripped answer, or None."""
    m = re.fullmatch(r"(-?)(" + NUMBER + r")", s)
    if m:
        v = Fraction(m.group(2).replace(",", ""))
        return -v if m.group(1) else v
    m = re.fullmatch(r"(-?)\\frac\{(-?)(" + NUMBER + r")\}\{(" + NUMBER + r")\}", s)
    if m and not (m.group(1) and m.group(2)):
        den = Fraction(m.group(4).replace(",", ""))
        if den == 0:
            return None
        v = Fraction(m.group(3).replace(",", "")) / den
        return -v if (m.group(1) or m.group(2)) else v
    return None


def math_equiv(a, b):
    try:
        sa, sb = strip_string(a), strip_string(b)
    except Exception:
        return a == b
    if sa == sb:
        return True
    if len(sa) > 400 or len(sb) > 400:
        return False
    va, vb = exact_value(sa), exact_value(sb)
    return va is not None and vb is not None and va == vb


def math(response, answer):
    try:
        boxed = last_boxed_only_string(response)
        if boxed is None:
            return 0.0, None
        pred = remove_boxed(boxed)
    except AssertionError:
        return 0.0, None
    return (1.0 if math_equiv(pred, answer) else 0.0), pred


# ----------------------------------------------------------------------------- dapo (verl math_dapo)

SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
REMOVED = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
           "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
           "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
           "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
           r",\!", "{,}", '"', "\\dots"]


def dapo_normalize(s):
    s = s.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in REMOVED:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    s = re.sub(r"(\\text\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def dapo_last_boxed(s):
    idx = s.rfind("\\boxed{")
    if idx < 0:
        return None
    depth = 0
    for i in range(idx, len(s)):
        if s[i] == "{":
            depth += 1
        if s[i] == "}":
            depth -= 1
            if depth == 0:
                return s[idx + 7 : i]
    return None


def dapo(response, answer):
    text = response[-300:]
    found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", text)
    pred = dapo_normalize(found[-1] if found else "[INVALID]")
    correct = pred == dapo_normalize(answer)
    if pred == "[INVALID]":
        box = dapo_last_boxed(text[-100:])
        if box is not None:
            pred = dapo_normalize(box)
            correct = pred == dapo_normalize(answer)
    return (1.0 if correct else -1.0), (None if pred == "[INVALID]" else pred)


# ----------------------------------------------------------------------------- countdown


def countdown_value(expr):
    """Value and numbers of an expression of + - * / over non-negative integers, or None."""
    if not re.fullmatch(r"[0-9+\-*/() ]+", expr) or "**" in expr or "//" in expr:
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    numbers = []

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if b == 0:
                raise ZeroDivisionError
            return a / b
        raise ValueError("node not allowed")

    try:
        value = ev(tree)
    except (ValueError, ZeroDivisionError):
        return None
    return value, numbers


def countdown(response, answer):
    target, nums = answer.split(":")
    target = int(target)
    nums = sorted(int(x) for x in nums.split(","))
    matches = list(re.finditer(r"<answer>(.*?)</answer>", response))
    if not matches:
        return 0.0, None
    expr = matches[-1].group(1).strip()
    got = countdown_value(expr)
    ok = got is not None and sorted(got[1]) == nums and got[0] == target
    return (1.0 if ok else 0.1), expr


# ----------------------------------------------------------------------------- synthetic


def synthetic(response, answer):
    pred = response.split("\n")[0].strip()
    return (1.0 if pred == answer else 0.0), pred


def label(task, response, answer):
    if task in ("gsm8k", "gsm8k_flexible"):
        return gsm8k(response, answer, task == "gsm8k_flexible")
    if task == "math":
        return math(response, answer)
    if task == "dapo":
        return dapo(response, answer)
    if task == "countdown":
        return countdown(response, answer)
    return synthetic(response, answer)


LONG = "x" * 400
CASES = [
    # gsm8k strict
    ("gsm8k", "She has 3 apples. #### 18", "18"),
    ("gsm8k", "#### 1,234", "1234"),
    ("gsm8k", "#### $18", "18"),
    ("gsm8k", "#### 18.", "18"),
    ("gsm8k", "#### 18.0", "18"),
    ("gsm8k", "#### -7", "-7"),
    ("gsm8k", "#### 5 then #### 6", "6"),
    ("gsm8k", "#### 5 then #### 6", "5"),
    ("gsm8k", "####18", "18"),
    ("gsm8k", "#### -", "0"),
    ("gsm8k", "#### --5", "5"),
    ("gsm8k", "##### 42", "42"),
    ("gsm8k", "", "1"),
    ("gsm8k", "#### 123456789012345678901234567890", "123456789012345678901234567890"),
    ("gsm8k", "#### ٣", "3"),
    ("gsm8k", "#### 12" + LONG, "12"),
    ("gsm8k", LONG + "#### 12", "12"),
    ("gsm8k", "é" * 299 + "#### 7", "7"),
    ("gsm8k", "#### 1.2.3,4", "1.2.34"),
    ("gsm8k", "#### .", "."),
    # gsm8k flexible
    ("gsm8k_flexible", "the answer is 42.", "42."),
    ("gsm8k_flexible", "the answer is 42. Done.", "42."),
    ("gsm8k_flexible", "so 1,000 dollars", "1,000"),
    ("gsm8k_flexible", "so 1,000 dollars", "1000"),
    ("gsm8k_flexible", "values 3 and -4 .", "-4"),
    ("gsm8k_flexible", ". . .", "."),
    ("gsm8k_flexible", "no digits here", "1"),
    ("gsm8k_flexible", "x-5-6", "-6"),
    ("gsm8k_flexible", "١٢٣ then 7", "7"),
    # math
    ("math", "so \\boxed{18}", "18"),
    ("math", "\\boxed{18.0}", "18"),
    ("math", "\\boxed{\\frac{1}{2}}", "0.5"),
    ("math", "\\boxed{\\dfrac12}", "\\frac{1}{2}"),
    ("math", "\\boxed{\\tfrac{3}{4}}", "0.75"),
    ("math", "\\boxed{1/4}", "0.25"),
    ("math", "\\boxed{-\\frac{2}{4}}", "-0.5"),
    ("math", "\\boxed{\\frac{-1}{2}}", "-\\frac{1}{2}"),
    ("math", "\\boxed{1,000}", "1000"),
    ("math", "\\boxed{1,00}", "100"),
    ("math", "\\boxed{\\sqrt2}", "\\sqrt{2}"),
    ("math", "\\boxed{\\left( 1, 2 \\right)}", "(1,2)"),
    ("math", "\\boxed{90^\\circ}", "90"),
    ("math", "\\boxed{50\\%}", "50"),
    ("math", "\\boxed{5 \\text{ cm}}", "5"),
    ("math", "\\boxed{5 \\text{ cm} \\text{ m}}", "5"),
    ("math", "\\boxed{x = 5}", "5"),
    ("math", "\\boxed{xyz = 5}", "5"),
    ("math", "\\boxed{.5}", "\\frac12"),
    ("math", "first \\boxed{1} then \\boxed{2}", "2"),
    ("math", "first \\boxed{1} then \\boxed{2}", "1"),
    ("math", "\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
    ("math", "\\boxed{{1}", "1"),
    ("math", "\\boxed{1}}", "1"),
    ("math", "\\boxed 7$ and more", "7"),
    ("math", "\\fbox{7}", "7"),
    ("math", "\\boxed{\\sqrt}", "\\sqrt"),
    ("math", "\\boxed{\\frac}", "\\frac"),
    ("math", "\\boxed{123456789012345678901234567890}", "123456789012345678901234567890.0"),
    ("math", "\\boxed{123456789012345678901234567891}", "123456789012345678901234567890"),
    ("math", "\\boxed{٣}", "3"),
    ("math", "", "1"),
    ("math", "\\boxed{}", ""),
    ("math", "\\boxed{\\frac{1}{0}}", "1/0"),
    ("math", "\\boxed{0.333}", "\\frac{1}{3}"),
    ("math", "\\boxed{10/4}", "2.5"),
    ("math", "\\boxed{\\$5}", "5"),
    ("math", "\\boxed{\\frac{3}{6}}", "\\frac{1}{2}"),
    # dapo
    ("dapo", "Answer: 42", "42"),
    ("dapo", "answer : 42", "42"),
    ("dapo", "ANSWER:\n42", "42"),
    ("dapo", "Answer: 41\nAnswer: 42", "42"),
    ("dapo", "Answer: 41\nAnswer: 42", "41"),
    ("dapo", "Answer: $\\frac{1}{2}$", "\\frac12"),
    ("dapo", "Answer: x = 3", "3"),
    ("dapo", "Answer: 1,000", "1000"),
    ("dapo", "Answer: ١,٢٣٤", "١٢٣٤"),
    ("dapo", "Answer: 5 cm", "5"),
    ("dapo", "Answer: \\text{(A)}", "(A)"),
    ("dapo", "Answer: \\boxed{7}", "7"),
    ("dapo", "Answer: \\sqrt2", "\\sqrt{2}"),
    ("dapo", "no answer line but \\boxed{7}", "7"),
    ("dapo", "no answer line but \\boxed{7" , "7"),
    ("dapo", "\\boxed{7}" + LONG, "7"),
    ("dapo", "", "0"),
    ("dapo", "Answer:   ", ""),
    ("dapo", "Answer:\t\n\n", ""),
    ("dapo", "Anſwer: 9", "9"),
    ("dapo", "Answer\u00a0:\u3000 9", "9"),
    ("dapo", "Answer: 123456789012345678901234567890", "123456789012345678901234567890"),
    ("dapo", "Answer: $3$ and $4$", "3"),
    ("dapo", "Answer: 90^\\circ", "90"),
    ("dapo", "Answer: \\overline{12}", "12"),
    ("dapo", "Answer: \\fracab", "\\frac{a}{b}"),
    ("dapo", "Answer: [INVALID]", "[INVALID]"),
    # countdown
    ("countdown", "<answer>(3 + 5) * (8 - 1) - 32</answer>", "24:3,5,8,1,32"),
    ("countdown", "<answer>8 * 3 * 1</answer>", "24:3,5,8,1"),
    ("countdown", "<answer>8 * 3 * (5 - 5 + 1)</answer>", "24:3,5,8,1"),
    ("countdown", "<answer>3*8*1 + 5 - 5</answer>", "24:3,5,8,1,5"),
    ("countdown", "<answer>8 / (3 - 8 / 3)</answer>", "24:8,3,8,3"),
    ("countdown", "<answer>8 / (3 - 3)</answer> ", "24:8,3,3"),
    ("countdown", "<answer>2 ** 3 * 3</answer>", "24:2,3,3"),
    ("countdown", "<answer>-3 + 27</answer>", "24:3,27"),
    ("countdown", "<answer>07 + 17</answer>", "24:7,17"),
    ("countdown", "<answer>7 + 17</answer> then <answer>1 + 1</answer>", "24:7,17"),
    ("countdown", "<answer>1 + 1</answer> then <answer>7 + 17</answer>", "24:7,17"),
    ("countdown", "<answer>7 +\n17</answer>", "24:7,17"),
    ("countdown", "<answer>((7 + 17)</answer>", "24:7,17"),
    ("countdown", "<answer>7 + 17)</answer>", "24:7,17"),
    ("countdown", "<answer>__import__('os')</answer>", "24:7,17"),
    ("countdown", "<answer>٧ + 17</answer>", "24:7,17"),
    ("countdown", "<answer></answer>", "0:0"),
    ("countdown", "", "24:7,17"),
    ("countdown", "<answer>99999999999999999999 - 99999999999999999975</answer>", "24:7,17"),
    ("countdown", "<answer> 7+17 </answer>", "24:7,17"),
    ("countdown", "<answer>7 17</answer>", "24:7,17"),
    ("countdown", "<answer>(((7)))+17</answer>", "24:7,17"),
    # synthetic
    ("add", "168", "168"),
    ("add", "168\nmore text", "168"),
    ("add", "  168  ", "168"),
    ("add", "169", "168"),
    ("add", "16", "168"),
    ("add", "1688", "168"),
    ("add", "", "168"),
    ("reverse", "dcba", "dcba"),
    ("reverse", "abcd", "dcba"),
    ("sort", "1234", "1234"),
    ("copy", "abcé", "abce"),
]


def main():
    out_dir = os.path.join("test", "fixtures", "reward")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for task, response, answer in CASES:
            reward, extracted = label(task, response, answer)
            f.write(json.dumps({"task": task, "response": response, "answer": answer, "reward": reward,
                                "extracted": extracted}, ensure_ascii=False) + "\n")
    print("%s: %d cases" % (path, len(CASES)))


if __name__ == "__main__":
    main()
