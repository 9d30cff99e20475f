"""The shipped demo dataset: question -> answer sentence pairs over a built-in table of facts.

Columns: id, fact, question, answer, topic. Every pair states one true fact from the tables
below; `fact` names it (the group id, e.g. `capital-france`; a row's id is `<fact>-q<n>`). Each
fact is asked several ways (4-7 question templates per relation, some of them reverse questions:
"Paris is the capital of which country?", "Which element has atomic number 29?") and answered in
a few ways (2-3 answer templates); each question is paired with exactly one answer phrasing,
chosen by a hash of the question text (no random state), so the output is byte-identical on every
run and machine. Evaluation is group-aware: a retrieved answer is right when it is any answer
text of the row's fact; no answer text belongs to two facts.

The data is built to discriminate, not to be matched by word overlap with the question:
- answers also mention a second true fact about the same subject, in the wording of the other
  questions about it (a capital answer names the country's currency and official language, a
  currency or language answer names the capital; an element's symbol answer names its atomic
  number and vice versa; a book's answer names another book by the same author), so the
  question's own embedding often lands on the answer to a sibling fact, while a map fitted on
  the training pairs learns which answer form each question takes;
- confusable facts that differ only in a number, year or season: all 118 elements (neighbouring
  atomic numbers; the lanthanides and heavy elements, whose names all end in -ium), the 47 US
  presidents by number, FIFA World Cup hosts and winners by year, Summer and Winter Olympic host
  cities by year (1924-1992 have both), countries sharing a currency (the euro, the CFA francs,
  the US dollar) or a continent, planets by order from the Sun. These are the items that tell
  models apart: a model must hold the fact, since the question's wording does not give it away.

No network, no external data: all facts are written out here. Where a fact is disputed, depends
on a convention, or is about to change (shared capitals, transcontinental countries, several
co-official languages, currencies in transition, a host city due to host again), the field is
left out (None) or the question is not asked, rather than guessed.

    python -m tools.demo_data [--out data/raw/qa_pairs.csv]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import re
import unicodedata
from pathlib import Path
from typing import Iterator

from pipeline.core.atomic import atomic_open

DEFAULT_OUT = "data/raw/qa_pairs.csv"
COLUMNS = ("id", "fact", "question", "answer", "topic")

# ---------------------------------------------------------------------------------------------
# Fact tables
# ---------------------------------------------------------------------------------------------

# (name as used mid-sentence, capital, currency, continent, official language).
# None = left out on purpose: disputed, several official values, transcontinental, or changing.
COUNTRIES: tuple[tuple[str, str | None, str | None, str | None, str | None], ...] = (
    ("Afghanistan", "Kabul", "the Afghan afghani", "Asia", None),
    ("Albania", "Tirana", "the Albanian lek", "Europe", "Albanian"),
    ("Algeria", "Algiers", "the Algerian dinar", "Africa", None),
    ("Angola", "Luanda", "the Angolan kwanza", "Africa", "Portuguese"),
    ("Argentina", "Buenos Aires", "the Argentine peso", "South America", None),
    ("Armenia", "Yerevan", "the Armenian dram", None, "Armenian"),
    ("Australia", "Canberra", "the Australian dollar", None, None),
    ("Austria", "Vienna", "the euro", "Europe", "German"),
    ("Azerbaijan", "Baku", "the Azerbaijani manat", None, "Azerbaijani"),
    ("Bahrain", "Manama", "the Bahraini dinar", "Asia", "Arabic"),
    ("Bangladesh", "Dhaka", "the Bangladeshi taka", "Asia", "Bengali"),
    ("Belarus", "Minsk", "the Belarusian ruble", "Europe", None),
    ("Belgium", "Brussels", "the euro", "Europe", None),
    ("Bhutan", "Thimphu", "the Bhutanese ngultrum", "Asia", "Dzongkha"),
    ("Bolivia", None, "the Bolivian boliviano", "South America", None),
    ("Bosnia and Herzegovina", "Sarajevo", "the convertible mark", "Europe", None),
    ("Botswana", "Gaborone", "the Botswana pula", "Africa", None),
    ("Brazil", "Brasília", "the Brazilian real", "South America", "Portuguese"),
    ("Bulgaria", "Sofia", None, "Europe", "Bulgarian"),
    ("Cambodia", "Phnom Penh", "the Cambodian riel", "Asia", "Khmer"),
    ("Cameroon", "Yaoundé", "the Central African CFA franc", "Africa", None),
    ("Canada", "Ottawa", "the Canadian dollar", "North America", None),
    ("Chile", "Santiago", "the Chilean peso", "South America", None),
    ("China", "Beijing", "the renminbi", "Asia", None),
    ("Colombia", "Bogotá", "the Colombian peso", "South America", None),
    ("Costa Rica", "San José", "the Costa Rican colón", "North America", "Spanish"),
    ("Croatia", "Zagreb", "the euro", "Europe", "Croatian"),
    ("Cuba", "Havana", "the Cuban peso", "North America", "Spanish"),
    ("Cyprus", "Nicosia", "the euro", None, None),
    ("the Czech Republic", "Prague", "the Czech koruna", "Europe", "Czech"),
    ("Denmark", "Copenhagen", "the Danish krone", "Europe", None),
    ("the Dominican Republic", "Santo Domingo", "the Dominican peso", "North America", "Spanish"),
    ("Ecuador", "Quito", "the United States dollar", "South America", None),
    ("Egypt", "Cairo", "the Egyptian pound", "Africa", "Arabic"),
    ("El Salvador", "San Salvador", None, "North America", "Spanish"),
    ("Estonia", "Tallinn", "the euro", "Europe", "Estonian"),
    ("Ethiopia", "Addis Ababa", "the Ethiopian birr", "Africa", None),
    ("Fiji", "Suva", "the Fijian dollar", None, None),
    ("Finland", "Helsinki", "the euro", "Europe", None),
    ("France", "Paris", "the euro", "Europe", "French"),
    ("Georgia", "Tbilisi", "the Georgian lari", None, None),
    ("Germany", "Berlin", "the euro", "Europe", "German"),
    ("Ghana", "Accra", "the Ghanaian cedi", "Africa", "English"),
    ("Greece", "Athens", "the euro", "Europe", "Greek"),
    ("Guatemala", "Guatemala City", "the Guatemalan quetzal", "North America", "Spanish"),
    ("Haiti", "Port-au-Prince", "the Haitian gourde", "North America", None),
    ("Honduras", "Tegucigalpa", "the Honduran lempira", "North America", "Spanish"),
    ("Hungary", "Budapest", "the Hungarian forint", "Europe", "Hungarian"),
    ("Iceland", "Reykjavík", "the Icelandic króna", "Europe", "Icelandic"),
    ("India", "New Delhi", "the Indian rupee", "Asia", None),
    ("Indonesia", None, "the Indonesian rupiah", None, "Indonesian"),
    ("Iran", "Tehran", "the Iranian rial", "Asia", "Persian"),
    ("Iraq", "Baghdad", "the Iraqi dinar", "Asia", None),
    ("Ireland", "Dublin", "the euro", "Europe", None),
    ("Italy", "Rome", "the euro", "Europe", "Italian"),
    ("Jamaica", "Kingston", "the Jamaican dollar", "North America", None),
    ("Japan", "Tokyo", "the Japanese yen", "Asia", None),
    ("Jordan", "Amman", "the Jordanian dinar", "Asia", "Arabic"),
    ("Kazakhstan", "Astana", "the Kazakhstani tenge", None, None),
    ("Kenya", "Nairobi", "the Kenyan shilling", "Africa", None),
    ("Kuwait", "Kuwait City", "the Kuwaiti dinar", "Asia", "Arabic"),
    ("Kyrgyzstan", "Bishkek", "the Kyrgyzstani som", "Asia", None),
    ("Laos", "Vientiane", "the Lao kip", "Asia", "Lao"),
    ("Latvia", "Riga", "the euro", "Europe", "Latvian"),
    ("Lebanon", "Beirut", "the Lebanese pound", "Asia", "Arabic"),
    ("Lithuania", "Vilnius", "the euro", "Europe", "Lithuanian"),
    ("Luxembourg", "Luxembourg City", "the euro", "Europe", None),
    ("Madagascar", "Antananarivo", "the Malagasy ariary", "Africa", None),
    ("Malawi", "Lilongwe", "the Malawian kwacha", "Africa", None),
    ("Malaysia", "Kuala Lumpur", "the Malaysian ringgit", "Asia", "Malay"),
    ("Mali", "Bamako", "the West African CFA franc", "Africa", None),
    ("Malta", "Valletta", "the euro", "Europe", None),
    ("Mexico", "Mexico City", "the Mexican peso", "North America", None),
    ("Moldova", "Chișinău", "the Moldovan leu", "Europe", None),
    ("Mongolia", "Ulaanbaatar", "the Mongolian tögrög", "Asia", "Mongolian"),
    ("Montenegro", "Podgorica", "the euro", "Europe", None),
    ("Morocco", "Rabat", "the Moroccan dirham", "Africa", None),
    ("Mozambique", "Maputo", "the Mozambican metical", "Africa", "Portuguese"),
    ("Myanmar", "Naypyidaw", "the Myanmar kyat", "Asia", "Burmese"),
    ("Namibia", "Windhoek", "the Namibian dollar", "Africa", "English"),
    ("Nepal", "Kathmandu", "the Nepalese rupee", "Asia", None),
    ("the Netherlands", "Amsterdam", "the euro", "Europe", None),
    ("New Zealand", "Wellington", "the New Zealand dollar", None, None),
    ("Nicaragua", "Managua", "the Nicaraguan córdoba", "North America", None),
    ("Niger", "Niamey", "the West African CFA franc", "Africa", None),
    ("Nigeria", "Abuja", "the Nigerian naira", "Africa", "English"),
    ("North Korea", "Pyongyang", "the North Korean won", "Asia", "Korean"),
    ("North Macedonia", "Skopje", "the Macedonian denar", "Europe", None),
    ("Norway", "Oslo", "the Norwegian krone", "Europe", None),
    ("Oman", "Muscat", "the Omani rial", "Asia", "Arabic"),
    ("Pakistan", "Islamabad", "the Pakistani rupee", "Asia", None),
    ("Panama", "Panama City", None, "North America", "Spanish"),
    ("Papua New Guinea", "Port Moresby", "the Papua New Guinean kina", None, None),
    ("Paraguay", "Asunción", "the Paraguayan guaraní", "South America", None),
    ("Peru", "Lima", "the Peruvian sol", "South America", None),
    ("the Philippines", "Manila", "the Philippine peso", "Asia", None),
    ("Poland", "Warsaw", "the Polish złoty", "Europe", "Polish"),
    ("Portugal", "Lisbon", "the euro", "Europe", "Portuguese"),
    ("Qatar", "Doha", "the Qatari riyal", "Asia", "Arabic"),
    ("Romania", "Bucharest", "the Romanian leu", "Europe", "Romanian"),
    ("Russia", "Moscow", "the Russian ruble", None, None),
    ("Rwanda", "Kigali", "the Rwandan franc", "Africa", None),
    ("Saudi Arabia", "Riyadh", "the Saudi riyal", "Asia", "Arabic"),
    ("Senegal", "Dakar", "the West African CFA franc", "Africa", None),
    ("Serbia", "Belgrade", "the Serbian dinar", "Europe", "Serbian"),
    ("Singapore", None, "the Singapore dollar", "Asia", None),
    ("Slovakia", "Bratislava", "the euro", "Europe", "Slovak"),
    ("Slovenia", "Ljubljana", "the euro", "Europe", None),
    ("South Africa", None, "the South African rand", "Africa", None),
    ("South Korea", "Seoul", "the South Korean won", "Asia", "Korean"),
    ("Spain", "Madrid", "the euro", "Europe", None),
    ("Sri Lanka", None, "the Sri Lankan rupee", "Asia", None),
    ("Sweden", "Stockholm", "the Swedish krona", "Europe", "Swedish"),
    ("Switzerland", None, "the Swiss franc", "Europe", None),
    ("Syria", "Damascus", "the Syrian pound", "Asia", "Arabic"),
    ("Tajikistan", "Dushanbe", "the Tajikistani somoni", "Asia", "Tajik"),
    ("Tanzania", "Dodoma", "the Tanzanian shilling", "Africa", None),
    ("Thailand", "Bangkok", "the Thai baht", "Asia", "Thai"),
    ("Tunisia", "Tunis", "the Tunisian dinar", "Africa", "Arabic"),
    ("Turkey", "Ankara", "the Turkish lira", None, "Turkish"),
    ("Turkmenistan", "Ashgabat", "the Turkmenistan manat", "Asia", "Turkmen"),
    ("Uganda", "Kampala", "the Ugandan shilling", "Africa", None),
    ("Ukraine", "Kyiv", "the Ukrainian hryvnia", "Europe", "Ukrainian"),
    ("the United Arab Emirates", "Abu Dhabi", "the UAE dirham", "Asia", "Arabic"),
    ("the United Kingdom", "London", "the pound sterling", "Europe", None),
    ("the United States", "Washington, D.C.", "the United States dollar", "North America", None),
    ("Uruguay", "Montevideo", "the Uruguayan peso", "South America", None),
    ("Uzbekistan", "Tashkent", "the Uzbekistani som", "Asia", "Uzbek"),
    ("Venezuela", "Caracas", None, "South America", None),
    ("Vietnam", "Hanoi", "the Vietnamese dong", "Asia", "Vietnamese"),
    ("Zambia", "Lusaka", "the Zambian kwacha", "Africa", "English"),
)

# (atomic number, symbol, name). IUPAC spellings (aluminium, caesium, sulfur). Every element, 1 to
# 118: neighbours on the periodic table (facts that differ only in one number; the lanthanides and
# the heavy elements, whose names all end in -ium) are what a model must tell apart by memory.
ELEMENTS: tuple[tuple[int, str, str], ...] = (
    (1, "H", "hydrogen"),
    (2, "He", "helium"),
    (3, "Li", "lithium"),
    (4, "Be", "beryllium"),
    (5, "B", "boron"),
    (6, "C", "carbon"),
    (7, "N", "nitrogen"),
    (8, "O", "oxygen"),
    (9, "F", "fluorine"),
    (10, "Ne", "neon"),
    (11, "Na", "sodium"),
    (12, "Mg", "magnesium"),
    (13, "Al", "aluminium"),
    (14, "Si", "silicon"),
    (15, "P", "phosphorus"),
    (16, "S", "sulfur"),
    (17, "Cl", "chlorine"),
    (18, "Ar", "argon"),
    (19, "K", "potassium"),
    (20, "Ca", "calcium"),
    (21, "Sc", "scandium"),
    (22, "Ti", "titanium"),
    (23, "V", "vanadium"),
    (24, "Cr", "chromium"),
    (25, "Mn", "manganese"),
    (26, "Fe", "iron"),
    (27, "Co", "cobalt"),
    (28, "Ni", "nickel"),
    (29, "Cu", "copper"),
    (30, "Zn", "zinc"),
    (31, "Ga", "gallium"),
    (32, "Ge", "germanium"),
    (33, "As", "arsenic"),
    (34, "Se", "selenium"),
    (35, "Br", "bromine"),
    (36, "Kr", "krypton"),
    (37, "Rb", "rubidium"),
    (38, "Sr", "strontium"),
    (39, "Y", "yttrium"),
    (40, "Zr", "zirconium"),
    (41, "Nb", "niobium"),
    (42, "Mo", "molybdenum"),
    (43, "Tc", "technetium"),
    (44, "Ru", "ruthenium"),
    (45, "Rh", "rhodium"),
    (46, "Pd", "palladium"),
    (47, "Ag", "silver"),
    (48, "Cd", "cadmium"),
    (49, "In", "indium"),
    (50, "Sn", "tin"),
    (51, "Sb", "antimony"),
    (52, "Te", "tellurium"),
    (53, "I", "iodine"),
    (54, "Xe", "xenon"),
    (55, "Cs", "caesium"),
    (56, "Ba", "barium"),
    (57, "La", "lanthanum"),
    (58, "Ce", "cerium"),
    (59, "Pr", "praseodymium"),
    (60, "Nd", "neodymium"),
    (61, "Pm", "promethium"),
    (62, "Sm", "samarium"),
    (63, "Eu", "europium"),
    (64, "Gd", "gadolinium"),
    (65, "Tb", "terbium"),
    (66, "Dy", "dysprosium"),
    (67, "Ho", "holmium"),
    (68, "Er", "erbium"),
    (69, "Tm", "thulium"),
    (70, "Yb", "ytterbium"),
    (71, "Lu", "lutetium"),
    (72, "Hf", "hafnium"),
    (73, "Ta", "tantalum"),
    (74, "W", "tungsten"),
    (75, "Re", "rhenium"),
    (76, "Os", "osmium"),
    (77, "Ir", "iridium"),
    (78, "Pt", "platinum"),
    (79, "Au", "gold"),
    (80, "Hg", "mercury"),
    (81, "Tl", "thallium"),
    (82, "Pb", "lead"),
    (83, "Bi", "bismuth"),
    (84, "Po", "polonium"),
    (85, "At", "astatine"),
    (86, "Rn", "radon"),
    (87, "Fr", "francium"),
    (88, "Ra", "radium"),
    (89, "Ac", "actinium"),
    (90, "Th", "thorium"),
    (91, "Pa", "protactinium"),
    (92, "U", "uranium"),
    (93, "Np", "neptunium"),
    (94, "Pu", "plutonium"),
    (95, "Am", "americium"),
    (96, "Cm", "curium"),
    (97, "Bk", "berkelium"),
    (98, "Cf", "californium"),
    (99, "Es", "einsteinium"),
    (100, "Fm", "fermium"),
    (101, "Md", "mendelevium"),
    (102, "No", "nobelium"),
    (103, "Lr", "lawrencium"),
    (104, "Rf", "rutherfordium"),
    (105, "Db", "dubnium"),
    (106, "Sg", "seaborgium"),
    (107, "Bh", "bohrium"),
    (108, "Hs", "hassium"),
    (109, "Mt", "meitnerium"),
    (110, "Ds", "darmstadtium"),
    (111, "Rg", "roentgenium"),
    (112, "Cn", "copernicium"),
    (113, "Nh", "nihonium"),
    (114, "Fl", "flerovium"),
    (115, "Mc", "moscovium"),
    (116, "Lv", "livermorium"),
    (117, "Ts", "tennessine"),
    (118, "Og", "oganesson"),
)

# Last atomic number of each period (row) of the periodic table: period of Z = 1 + how many of
# these are below Z.
PERIOD_ENDS = (2, 10, 18, 36, 54, 86, 118)

# (year, season, host city, present-day country or None). Only Games held in one city in the year
# they are named for (the 2020 Summer Games, held in 2021, and 1956 Melbourne, whose equestrian
# events were in Stockholm, are left out; Squaw Valley has since been renamed). The country is
# left out where the host country no longer exists under that name (West Germany, the Soviet
# Union, Yugoslavia).
OLYMPICS: tuple[tuple[int, str, str, str | None], ...] = (
    (1896, "Summer", "Athens", "Greece"),
    (1900, "Summer", "Paris", "France"),
    (1904, "Summer", "St. Louis", "the United States"),
    (1908, "Summer", "London", "the United Kingdom"),
    (1912, "Summer", "Stockholm", "Sweden"),
    (1920, "Summer", "Antwerp", "Belgium"),
    (1924, "Summer", "Paris", "France"),
    (1928, "Summer", "Amsterdam", "the Netherlands"),
    (1932, "Summer", "Los Angeles", "the United States"),
    (1936, "Summer", "Berlin", "Germany"),
    (1948, "Summer", "London", "the United Kingdom"),
    (1952, "Summer", "Helsinki", "Finland"),
    (1960, "Summer", "Rome", "Italy"),
    (1964, "Summer", "Tokyo", "Japan"),
    (1968, "Summer", "Mexico City", "Mexico"),
    (1972, "Summer", "Munich", None),
    (1976, "Summer", "Montreal", "Canada"),
    (1980, "Summer", "Moscow", None),
    (1984, "Summer", "Los Angeles", "the United States"),
    (1988, "Summer", "Seoul", "South Korea"),
    (1992, "Summer", "Barcelona", "Spain"),
    (1996, "Summer", "Atlanta", "the United States"),
    (2000, "Summer", "Sydney", "Australia"),
    (2004, "Summer", "Athens", "Greece"),
    (2008, "Summer", "Beijing", "China"),
    (2012, "Summer", "London", "the United Kingdom"),
    (2016, "Summer", "Rio de Janeiro", "Brazil"),
    (2024, "Summer", "Paris", "France"),
    (1924, "Winter", "Chamonix", "France"),
    (1928, "Winter", "St. Moritz", "Switzerland"),
    (1932, "Winter", "Lake Placid", "the United States"),
    (1936, "Winter", "Garmisch-Partenkirchen", "Germany"),
    (1948, "Winter", "St. Moritz", "Switzerland"),
    (1952, "Winter", "Oslo", "Norway"),
    (1956, "Winter", "Cortina d'Ampezzo", "Italy"),
    (1964, "Winter", "Innsbruck", "Austria"),
    (1968, "Winter", "Grenoble", "France"),
    (1972, "Winter", "Sapporo", "Japan"),
    (1976, "Winter", "Innsbruck", "Austria"),
    (1980, "Winter", "Lake Placid", "the United States"),
    (1984, "Winter", "Sarajevo", None),
    (1988, "Winter", "Calgary", "Canada"),
    (1992, "Winter", "Albertville", "France"),
    (1994, "Winter", "Lillehammer", "Norway"),
    (1998, "Winter", "Nagano", "Japan"),
    (2002, "Winter", "Salt Lake City", "the United States"),
    (2006, "Winter", "Turin", "Italy"),
    (2010, "Winter", "Vancouver", "Canada"),
    (2014, "Winter", "Sochi", "Russia"),
    (2018, "Winter", "Pyeongchang", "South Korea"),
    (2022, "Winter", "Beijing", "China"),
)
# Cities asked "In which year did <city> host the <season> Olympics?" only where that has one answer
# for good: not a city that hosted that season twice (in this table or outside it: Tokyo 2020,
# Stockholm's 1956 equestrian events) or is due to host it again (Cortina d'Ampezzo 2026, Salt
# Lake City 2034, Los Angeles 2028).
OLYMPICS_NO_REVERSE = frozenset(
    {("Tokyo", "Summer"), ("Stockholm", "Summer"), ("Cortina d'Ampezzo", "Winter"), ("Salt Lake City", "Winter")}
)

# (number, name, year the term began), in order. Grover Cleveland (22nd and 24th) and Donald Trump
# (45th and 47th) served two non-consecutive terms: "which number president was he?" has two
# answers for them, so it is not asked.
PRESIDENTS: tuple[tuple[int, str, int], ...] = (
    (1, "George Washington", 1789),
    (2, "John Adams", 1797),
    (3, "Thomas Jefferson", 1801),
    (4, "James Madison", 1809),
    (5, "James Monroe", 1817),
    (6, "John Quincy Adams", 1825),
    (7, "Andrew Jackson", 1829),
    (8, "Martin Van Buren", 1837),
    (9, "William Henry Harrison", 1841),
    (10, "John Tyler", 1841),
    (11, "James K. Polk", 1845),
    (12, "Zachary Taylor", 1849),
    (13, "Millard Fillmore", 1850),
    (14, "Franklin Pierce", 1853),
    (15, "James Buchanan", 1857),
    (16, "Abraham Lincoln", 1861),
    (17, "Andrew Johnson", 1865),
    (18, "Ulysses S. Grant", 1869),
    (19, "Rutherford B. Hayes", 1877),
    (20, "James A. Garfield", 1881),
    (21, "Chester A. Arthur", 1881),
    (22, "Grover Cleveland", 1885),
    (23, "Benjamin Harrison", 1889),
    (24, "Grover Cleveland", 1893),
    (25, "William McKinley", 1897),
    (26, "Theodore Roosevelt", 1901),
    (27, "William Howard Taft", 1909),
    (28, "Woodrow Wilson", 1913),
    (29, "Warren G. Harding", 1921),
    (30, "Calvin Coolidge", 1923),
    (31, "Herbert Hoover", 1929),
    (32, "Franklin D. Roosevelt", 1933),
    (33, "Harry S. Truman", 1945),
    (34, "Dwight D. Eisenhower", 1953),
    (35, "John F. Kennedy", 1961),
    (36, "Lyndon B. Johnson", 1963),
    (37, "Richard Nixon", 1969),
    (38, "Gerald Ford", 1974),
    (39, "Jimmy Carter", 1977),
    (40, "Ronald Reagan", 1981),
    (41, "George H. W. Bush", 1989),
    (42, "Bill Clinton", 1993),
    (43, "George W. Bush", 2001),
    (44, "Barack Obama", 2009),
    (45, "Donald Trump", 2017),
    (46, "Joe Biden", 2021),
    (47, "Donald Trump", 2025),
)

# (year, host country, winner, host asked). Tournaments up to 2022, facts that differ only in the
# year. 2002 had two hosts: its host is context in the answers, never asked. "In which year did X
# host it?" only for a country that hosted once and is not due to host again (not the 2026 hosts,
# not the 2030 ones: Spain, Portugal, Morocco, Uruguay, Argentina, Paraguay), and not Germany or
# West Germany (one country or two?). "When did X win it?" is never asked: most winners won several.
WORLD_CUPS: tuple[tuple[int, str, str, bool], ...] = (
    (1930, "Uruguay", "Uruguay", True),
    (1934, "Italy", "Italy", True),
    (1938, "France", "Italy", True),
    (1950, "Brazil", "Uruguay", True),
    (1954, "Switzerland", "West Germany", True),
    (1958, "Sweden", "Brazil", True),
    (1962, "Chile", "Brazil", True),
    (1966, "England", "England", True),
    (1970, "Mexico", "Brazil", True),
    (1974, "West Germany", "West Germany", True),
    (1978, "Argentina", "Argentina", True),
    (1982, "Spain", "Italy", True),
    (1986, "Mexico", "Argentina", True),
    (1990, "Italy", "West Germany", True),
    (1994, "the United States", "Brazil", True),
    (1998, "France", "France", True),
    (2002, "South Korea and Japan", "Brazil", False),
    (2006, "Germany", "Italy", True),
    (2010, "South Africa", "Spain", True),
    (2014, "Brazil", "Germany", True),
    (2018, "Russia", "France", True),
    (2022, "Qatar", "Argentina", True),
)
WORLD_CUP_REVERSE = frozenset({"Switzerland", "Sweden", "Chile", "England", "South Africa", "Russia", "Qatar"})

PLANETS: tuple[str, ...] = (
    "Mercury",
    "Venus",
    "Earth",
    "Mars",
    "Jupiter",
    "Saturn",
    "Uranus",
    "Neptune",
)  # in order from the Sun

ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight")

# (planet, predicate used in questions "Which planet ...?", two answer sentences).
PLANET_FEATURES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Mercury",
        "is closest to the Sun",
        "Mercury is the planet closest to the Sun.",
        "The closest planet to the Sun is Mercury.",
    ),
    (
        "Mercury",
        "is the smallest in the Solar System",
        "Mercury is the smallest planet in the Solar System.",
        "The smallest planet in the Solar System is Mercury.",
    ),
    (
        "Venus",
        "is the hottest in the Solar System",
        "Venus is the hottest planet in the Solar System.",
        "The hottest planet in the Solar System is Venus.",
    ),
    (
        "Venus",
        "is the brightest in the night sky",
        "Venus is the brightest planet in the night sky.",
        "The brightest planet seen in the night sky is Venus.",
    ),
    (
        "Earth",
        "is the only one known to support life",
        "Earth is the only planet known to support life.",
        "The only planet known to support life is Earth.",
    ),
    (
        "Earth",
        "is the only one known to have liquid water on its surface",
        "Earth is the only planet known to have liquid water on its surface.",
        "The only planet known to have liquid water on its surface is Earth.",
    ),
    (
        "Mars",
        "is known as the Red Planet",
        "Mars is known as the Red Planet.",
        "The planet called the Red Planet is Mars.",
    ),
    (
        "Mars",
        "has the volcano Olympus Mons",
        "Mars is the planet where the volcano Olympus Mons is found.",
        "The volcano Olympus Mons is on Mars.",
    ),
    (
        "Jupiter",
        "is the largest in the Solar System",
        "Jupiter is the largest planet in the Solar System.",
        "The largest planet in the Solar System is Jupiter.",
    ),
    (
        "Jupiter",
        "has the Great Red Spot",
        "Jupiter is the planet with the Great Red Spot.",
        "The Great Red Spot is a giant storm on Jupiter.",
    ),
    (
        "Saturn",
        "is best known for its bright ring system",
        "Saturn is the planet best known for its bright rings.",
        "The planet famous for its bright ring system is Saturn.",
    ),
    (
        "Saturn",
        "is the least dense in the Solar System",
        "Saturn is the least dense planet in the Solar System.",
        "The least dense planet in the Solar System is Saturn.",
    ),
    (
        "Uranus",
        "rotates on its side",
        "Uranus is the planet that rotates on its side.",
        "The planet whose axis is tipped so far that it spins on its side is Uranus.",
    ),
    (
        "Uranus",
        "was the first to be discovered with a telescope",
        "Uranus was the first planet discovered with a telescope.",
        "The first planet found with a telescope was Uranus.",
    ),
    (
        "Neptune",
        "is farthest from the Sun",
        "Neptune is the planet farthest from the Sun.",
        "The farthest planet from the Sun is Neptune.",
    ),
    (
        "Neptune",
        "has the strongest winds in the Solar System",
        "Neptune has the strongest winds of any planet in the Solar System.",
        "The planet with the strongest winds in the Solar System is Neptune.",
    ),
)

# (animal, name of its young).
ANIMAL_YOUNG: tuple[tuple[str, str], ...] = (
    ("cat", "kitten"),
    ("dog", "puppy"),
    ("cow", "calf"),
    ("horse", "foal"),
    ("sheep", "lamb"),
    ("goat", "kid"),
    ("pig", "piglet"),
    ("kangaroo", "joey"),
    ("koala", "joey"),
    ("frog", "tadpole"),
    ("swan", "cygnet"),
    ("goose", "gosling"),
    ("duck", "duckling"),
    ("owl", "owlet"),
    ("eagle", "eaglet"),
    ("bear", "cub"),
    ("lion", "cub"),
    ("tiger", "cub"),
    ("leopard", "cub"),
    ("wolf", "pup"),
    ("deer", "fawn"),
    ("chicken", "chick"),
    ("butterfly", "caterpillar"),
    ("elephant", "calf"),
    ("whale", "calf"),
    ("dolphin", "calf"),
    ("giraffe", "calf"),
    ("camel", "calf"),
    ("seal", "pup"),
    ("hare", "leveret"),
    ("eel", "elver"),
    ("turkey", "poult"),
    ("pigeon", "squab"),
    ("zebra", "foal"),
    ("donkey", "foal"),
    ("llama", "cria"),
    ("hedgehog", "hoglet"),
    ("porcupine", "porcupette"),
    ("spider", "spiderling"),
    ("beaver", "kit"),
    ("ferret", "kit"),
    ("mouse", "pup"),
    ("fly", "maggot"),
)

# (animals, plural as in "a group of ...", collective noun).
ANIMAL_GROUPS: tuple[tuple[str, str], ...] = (
    ("lions", "pride"),
    ("wolves", "pack"),
    ("fish", "school"),
    ("bees", "swarm"),
    ("crows", "murder"),
    ("geese", "gaggle"),
    ("owls", "parliament"),
    ("elephants", "herd"),
    ("dolphins", "pod"),
    ("whales", "pod"),
    ("ants", "colony"),
    ("sheep", "flock"),
    ("kangaroos", "mob"),
    ("monkeys", "troop"),
    ("starlings", "murmuration"),
    ("puppies", "litter"),
    ("cats", "clowder"),
    ("rhinoceroses", "crash"),
    ("giraffes", "tower"),
    ("flamingos", "flamboyance"),
    ("ferrets", "business"),
    ("ravens", "unkindness"),
    ("hyenas", "cackle"),
    ("zebras", "dazzle"),
    ("bats", "colony"),
    ("camels", "caravan"),
    ("cattle", "herd"),
    ("oysters", "bed"),
    ("jellyfish", "smack"),
    ("larks", "exaltation"),
    ("quail", "covey"),
    ("foxes", "skulk"),
    ("penguins", "colony"),
)

# (animal, verb in the third person, noun for the sound).
ANIMAL_SOUNDS: tuple[tuple[str, str, str], ...] = (
    ("dog", "barks", "bark"),
    ("cat", "meows", "meow"),
    ("cow", "moos", "moo"),
    ("lion", "roars", "roar"),
    ("duck", "quacks", "quack"),
    ("horse", "neighs", "neigh"),
    ("sheep", "bleats", "bleat"),
    ("pig", "oinks", "oink"),
    ("snake", "hisses", "hiss"),
    ("owl", "hoots", "hoot"),
    ("frog", "croaks", "croak"),
    ("bee", "buzzes", "buzz"),
    ("wolf", "howls", "howl"),
    ("donkey", "brays", "bray"),
    ("rooster", "crows", "crow"),
    ("mouse", "squeaks", "squeak"),
    ("elephant", "trumpets", "trumpet"),
    ("turkey", "gobbles", "gobble"),
    ("dove", "coos", "coo"),
    ("crow", "caws", "caw"),
    ("goose", "honks", "honk"),
)

# (title, author).
BOOKS: tuple[tuple[str, str], ...] = (
    ("Pride and Prejudice", "Jane Austen"),
    ("Emma", "Jane Austen"),
    ("Sense and Sensibility", "Jane Austen"),
    ("Persuasion", "Jane Austen"),
    ("Nineteen Eighty-Four", "George Orwell"),
    ("Animal Farm", "George Orwell"),
    ("To Kill a Mockingbird", "Harper Lee"),
    ("The Great Gatsby", "F. Scott Fitzgerald"),
    ("Moby-Dick", "Herman Melville"),
    ("War and Peace", "Leo Tolstoy"),
    ("Anna Karenina", "Leo Tolstoy"),
    ("Crime and Punishment", "Fyodor Dostoevsky"),
    ("The Brothers Karamazov", "Fyodor Dostoevsky"),
    ("Don Quixote", "Miguel de Cervantes"),
    ("Hamlet", "William Shakespeare"),
    ("Macbeth", "William Shakespeare"),
    ("Romeo and Juliet", "William Shakespeare"),
    ("Othello", "William Shakespeare"),
    ("Frankenstein", "Mary Shelley"),
    ("Dracula", "Bram Stoker"),
    ("Jane Eyre", "Charlotte Brontë"),
    ("Wuthering Heights", "Emily Brontë"),
    ("Great Expectations", "Charles Dickens"),
    ("Oliver Twist", "Charles Dickens"),
    ("A Tale of Two Cities", "Charles Dickens"),
    ("David Copperfield", "Charles Dickens"),
    ("A Christmas Carol", "Charles Dickens"),
    ("The Adventures of Tom Sawyer", "Mark Twain"),
    ("Adventures of Huckleberry Finn", "Mark Twain"),
    ("The Catcher in the Rye", "J. D. Salinger"),
    ("Brave New World", "Aldous Huxley"),
    ("Fahrenheit 451", "Ray Bradbury"),
    ("The Hobbit", "J. R. R. Tolkien"),
    ("The Lord of the Rings", "J. R. R. Tolkien"),
    ("Harry Potter and the Philosopher's Stone", "J. K. Rowling"),
    ("The Old Man and the Sea", "Ernest Hemingway"),
    ("A Farewell to Arms", "Ernest Hemingway"),
    ("The Sun Also Rises", "Ernest Hemingway"),
    ("Of Mice and Men", "John Steinbeck"),
    ("The Grapes of Wrath", "John Steinbeck"),
    ("One Hundred Years of Solitude", "Gabriel García Márquez"),
    ("Les Misérables", "Victor Hugo"),
    ("The Hunchback of Notre-Dame", "Victor Hugo"),
    ("The Count of Monte Cristo", "Alexandre Dumas"),
    ("The Three Musketeers", "Alexandre Dumas"),
    ("Madame Bovary", "Gustave Flaubert"),
    ("The Metamorphosis", "Franz Kafka"),
    ("The Trial", "Franz Kafka"),
    ("Ulysses", "James Joyce"),
    ("Mrs Dalloway", "Virginia Woolf"),
    ("Lord of the Flies", "William Golding"),
    ("The Picture of Dorian Gray", "Oscar Wilde"),
    ("Alice's Adventures in Wonderland", "Lewis Carroll"),
    ("Treasure Island", "Robert Louis Stevenson"),
    ("The Time Machine", "H. G. Wells"),
    ("The War of the Worlds", "H. G. Wells"),
    ("Around the World in Eighty Days", "Jules Verne"),
    ("Gulliver's Travels", "Jonathan Swift"),
    ("Robinson Crusoe", "Daniel Defoe"),
    ("The Divine Comedy", "Dante Alighieri"),
    ("Little Women", "Louisa May Alcott"),
    ("The Jungle Book", "Rudyard Kipling"),
    ("The Little Prince", "Antoine de Saint-Exupéry"),
    ("Things Fall Apart", "Chinua Achebe"),
    ("Beloved", "Toni Morrison"),
    ("The Handmaid's Tale", "Margaret Atwood"),
    ("Slaughterhouse-Five", "Kurt Vonnegut"),
    ("Catch-22", "Joseph Heller"),
    ("Heart of Darkness", "Joseph Conrad"),
    ("The Scarlet Letter", "Nathaniel Hawthorne"),
    ("The Call of the Wild", "Jack London"),
    ("Uncle Tom's Cabin", "Harriet Beecher Stowe"),
    ("Lolita", "Vladimir Nabokov"),
    ("On the Origin of Species", "Charles Darwin"),
    ("The Prince", "Niccolò Machiavelli"),
    ("Doctor Zhivago", "Boris Pasternak"),
    ("The Canterbury Tales", "Geoffrey Chaucer"),
    ("Paradise Lost", "John Milton"),
)

# (invention as used mid-sentence, inventor). Only attributions that are not seriously disputed.
INVENTIONS: tuple[tuple[str, str], ...] = (
    ("dynamite", "Alfred Nobel"),
    ("the World Wide Web", "Tim Berners-Lee"),
    ("the phonograph", "Thomas Edison"),
    ("the telephone", "Alexander Graham Bell"),
    ("the Braille writing system", "Louis Braille"),
    ("the lightning rod", "Benjamin Franklin"),
    ("the cotton gin", "Eli Whitney"),
    ("the diesel engine", "Rudolf Diesel"),
    ("the mercury thermometer", "Daniel Gabriel Fahrenheit"),
    ("the mercury barometer", "Evangelista Torricelli"),
    ("the stethoscope", "René Laennec"),
    ("the smallpox vaccine", "Edward Jenner"),
    ("the saxophone", "Adolphe Sax"),
    ("the Rubik's Cube", "Ernő Rubik"),
    ("the ballpoint pen", "László Bíró"),
    ("the spinning jenny", "James Hargreaves"),
    ("the flying shuttle", "John Kay"),
    ("the water frame", "Richard Arkwright"),
    ("the spinning mule", "Samuel Crompton"),
    ("the safety elevator", "Elisha Otis"),
    ("the Gatling gun", "Richard Gatling"),
    ("the AK-47 rifle", "Mikhail Kalashnikov"),
    ("the hovercraft", "Christopher Cockerell"),
    ("the cyclotron", "Ernest Lawrence"),
    ("the Jacquard loom", "Joseph Marie Jacquard"),
    ("the Davy safety lamp", "Humphry Davy"),
    ("the Tesla coil", "Nikola Tesla"),
    ("the Stirling engine", "Robert Stirling"),
    ("pasteurization", "Louis Pasteur"),
    ("the cash register", "James Ritty"),
    ("the Ferris wheel", "George Washington Gale Ferris Jr."),
    ("the Polaroid instant camera", "Edwin Land"),
    ("the Celsius temperature scale", "Anders Celsius"),
    ("the Fahrenheit temperature scale", "Daniel Gabriel Fahrenheit"),
    ("the Segway", "Dean Kamen"),
    ("the Petri dish", "Julius Richard Petri"),
    ("the Mason jar", "John Landis Mason"),
    ("the voltaic pile", "Alessandro Volta"),
    ("Kevlar", "Stephanie Kwolek"),
    ("the game of basketball", "James Naismith"),
    ("the Enigma machine", "Arthur Scherbius"),
    ("the vacuum flask", "James Dewar"),
    ("the pendulum clock", "Christiaan Huygens"),
    ("Morse code", "Samuel Morse"),
    ("the horse-drawn seed drill", "Jethro Tull"),
    ("the analytical engine", "Charles Babbage"),
)

# ---------------------------------------------------------------------------------------------
# Templates: per relation, question templates (4-7) and answer templates (2-3).
# Fields are str.format names; "X" variants are the same value with its first letter capitalized.
# ---------------------------------------------------------------------------------------------

TEMPLATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "capital": (
        (
            "What is the capital of {c}?",
            "Which city is the capital of {c}?",
            "Name the capital city of {c}.",
            "What city serves as {c_pos} capital?",
            "What is the name of {c_pos} capital city?",
            "{Cap} is the capital of which country?",
            "Which country has {cap} as its capital city?",
        ),
        (
            "{Cap} is the capital city of {c}{cont_end}{also}.",
            "The capital of {c}{cont_mid} is {cap}{also}.",
            "{C}{cont_mid} has {cap} as its capital city{also}.",
        ),
    ),
    "currency": (
        (
            "What is the currency of {c}?",
            "What currency is used in {c}?",
            "What money do people use in {c}?",
            "Name the official currency of {c}.",
            "What is {c_pos} currency called?",
            "In {c}, what is the currency?",
        ),
        (
            "People in {c}{cap_mid} pay with {cur}.",
            "The money used in {c}{cap_mid} is {cur}.",
            "Prices in {c}{cap_mid} are paid in {cur}.",
        ),
    ),
    "official_language": (
        (
            "What is the official language of {c}?",
            "Which language is official in {c}?",
            "What is {c_pos} official language?",
            "Which language has official status in {c}?",
            "In {c}, what is the official language?",
            "What language is used officially in {c}?",
        ),
        (
            "The official language of {c}{cap_mid} is {lang}.",
            "{Lang} is the official language of {c}{cap_end}{cur_end}.",
            "In {c}{cap_mid} the language with official status is {lang}.",
        ),
    ),
    # Asked both ways: the symbol of an element, and the element a symbol stands for (one fact).
    "element_symbol": (
        (
            "What is the chemical symbol for {el}?",
            "Which chemical symbol represents {el}?",
            "{El} has which chemical symbol?",
            "Which element has the chemical symbol {sym}?",
            "What element does the symbol {sym} stand for?",
            "Name the element whose symbol is {sym}.",
            "How is {el} written as a chemical symbol?",
        ),
        (
            "{Sym} is the chemical symbol for {el}, element number {n}.",
            "{El}, with atomic number {n}, has the chemical symbol {sym}.",
            "On the periodic table, {el} (element {n}, period {per}) is written as {sym}.",
        ),
    ),
    # Asked both ways: the atomic number of an element, and the element with a given number.
    "atomic_number": (
        (
            "What is the atomic number of {el}?",
            "How many protons does an atom of {el} have?",
            "{El} has what atomic number?",
            "Which element has atomic number {n}?",
            "What element has {n} {protons} in the nucleus of each atom?",
            "Element number {n} on the periodic table is which element?",
            "Give the atomic number of {el}.",
        ),
        (
            "{El}, whose chemical symbol is {sym}, has atomic number {n}.",
            "Every atom of {el} ({sym}) has {n} {protons} in its nucleus.",
            "Element number {n}, in period {per} of the periodic table, is {el} ({sym}).",
        ),
    ),
    "planet_order": (
        (
            "Which planet is {ord} from the Sun?",
            "What is the {ord} planet from the Sun?",
            "Name the {ord} planet from the Sun.",
            "What is the position of {p} in order from the Sun?",
            "Counting outward from the Sun, what number planet is {p}?",
            "Where is {p} in the order of the planets from the Sun?",
        ),
        (
            "{P} is the {ord} planet from the Sun.",
            "The {ord} planet from the Sun is {p}.",
            "Counting outward from the Sun, {p} is planet number {num}.",
        ),
    ),
    "planet_feature": (
        (
            "Which planet {pred}?",
            "What planet {pred}?",
            "Name the planet that {pred}.",
            "Do you know which planet {pred}?",
            "Of the eight planets, which one {pred}?",
        ),
        ("{ans1}", "{ans2}"),
    ),
    "animal_young": (
        (
            "What is a baby {a} called?",
            "What do you call a young {a}?",
            "A young {a} is known as what?",
            "What term is used for the young of {a_art}?",
        ),
        (
            "A baby {a} is called {y_art}.",
            "The young of {a_art} is known as {y_art}.",
            "{Y_art} is what a young {a} is called.",
        ),
    ),
    "animal_group": (
        (
            "What is a group of {pl} called?",
            "What do you call a group of {pl}?",
            "What is the collective noun for {pl}?",
            "A group of {pl} is known as what?",
        ),
        (
            "A group of {pl} is called {g_art}.",
            "The collective noun for {pl} is {g_art}.",
            "{G_art} is a group of {pl}.",
        ),
    ),
    "animal_sound": (
        (
            "What sound does {a_art} make?",
            "What noise does {a_art} make?",
            "What is the sound of {a_art} called?",
            "Which sound is made by {a_art}?",
        ),
        (
            "{A_art} {verb}.",
            "The sound {a_art} makes is called {noun_art}.",
            "The noise made by {a_art} is {noun_art}.",
        ),
    ),
    "book_author": (
        (
            "Who wrote {t}?",
            "Who is the author of {t}?",
            "{T} was written by whom?",
            "Name the author of {t}.",
            "Who penned {t}?",
            "Which writer wrote {t}?",
        ),
        (
            "{T} was written by {au}{also}.",
            "{Au}{also_mid} wrote {t}.",
            "The author of {t} is {au}{also}.",
        ),
    ),
    "inventor": (
        (
            "Who invented {inv}?",
            "Who is credited with inventing {inv}?",
            "{Inv} was invented by whom?",
            "Name the inventor of {inv}.",
            "Who came up with {inv}?",
            "Which inventor created {inv}?",
        ),
        (
            "{Inv} was invented by {who}.",
            "{Who} invented {inv}.",
            "The inventor of {inv} was {who}.",
        ),
    ),
    # Neighbours on the periodic table, asked both ways (one fact: X is followed by Y). The answer
    # about "what follows X" also names X, as does the one about what follows X's predecessor:
    # the question's direction decides which is right.
    "element_next": (
        (
            "Which element comes right after {el} on the periodic table?",
            "What is the next element after {el}?",
            "Which element follows {el} in the periodic table?",
            "Which element comes just before {el2} on the periodic table?",
            "What element precedes {el2} in the periodic table?",
        ),
        (
            "{El2} (element {n2}) comes right after {el} (element {n}) on the periodic table.",
            "On the periodic table, {el} (element {n}) is followed by {el2} (element {n2}).",
            "The element after {el}, number {n}, is {el2}, number {n2}.",
        ),
    ),
    # Presidents by number: facts that differ only in a number (and the year in the answers).
    "president_order": (
        (
            "Who was the {nth} president of the United States?",
            "Name the {nth} president of the United States.",
            "Who served as the {nth} US president?",
            "Who was president number {n} of the United States?",
            "{Rname} was which number president of the United States?",
            "What number president of the United States was {rname}?",
        ),
        (
            "{Name} was the {nth} president of the United States, taking office in {year}.",
            "The {nth} president of the United States was {name}, who took office in {year}.",
            "In {year}, {name} took office as the {nth} president of the United States.",
        ),
    ),
    # FIFA World Cups by year: the host and the winner of one year are two facts; each answer
    # names the other as context, as the capital and currency answers do.
    "world_cup_host": (
        (
            "Which country hosted the {y} FIFA World Cup?",
            "Where was the {y} FIFA World Cup held?",
            "The {y} World Cup took place in which country?",
            "Name the host country of the {y} FIFA World Cup.",
            "In which year did {rhost} host the FIFA World Cup?",
        ),
        (
            "The {y} FIFA World Cup was held in {host}, and {winner} won it.",
            "{Host} hosted the FIFA World Cup in {y}, which {winner} won.",
            "In {y}, the FIFA World Cup took place in {host} and was won by {winner}.",
        ),
    ),
    "world_cup_winner": (
        (
            "Which country won the {y} FIFA World Cup?",
            "Who won the {y} World Cup?",
            "Name the winner of the {y} FIFA World Cup.",
            "Which team became world champions at the {y} FIFA World Cup?",
        ),
        (
            "{Winner} won the {y} FIFA World Cup, played in {host}.",
            "The {y} FIFA World Cup, held in {host}, was won by {winner}.",
            "At the {y} FIFA World Cup in {host}, {winner} became world champions.",
        ),
    ),
    # Host cities: facts that differ only in the year or the season. The reverse questions (the
    # last two) only for a city that hosted that season once (see OLYMPICS_NO_REVERSE).
    "olympics": (
        (
            "Which city hosted the {y} {s} Olympics?",
            "Where were the {y} {s} Olympic Games held?",
            "Name the host city of the {y} {s} Olympics.",
            "The {y} {s} Olympics took place in which city?",
            "In which year did {rcity} host the {s} Olympics?",
            "When did {rcity} host the {s} Olympic Games?",
        ),
        (
            "The {y} {s} Olympics were held in {where}.",
            "{City} hosted the {s} Olympic Games in {y}.",
            "In {y}, the {s} Olympics took place in {where}.",
        ),
    ),
}

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _art(word: str) -> str:
    """'a'/'an' + word, by the first letter (enough for the words in these tables)."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _pos(name: str) -> str:
    """Possessive: plural-form names ("the Netherlands") take a bare apostrophe, others "'s"."""
    return name + ("'" if name.startswith("the ") and name.endswith("s") else "'s")


def _slug(s: str) -> str:
    s = unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode("ascii").lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def _with_caps(fields: dict[str, str]) -> dict[str, str]:
    """Add a capitalized variant under the key with its first letter upper-cased."""
    out = dict(fields)
    for k, v in fields.items():
        out[_cap(k)] = _cap(v)
    return out


def _finish(text: str) -> str:
    # A value that ends in a period ("Washington, D.C.", "Jr.") must not end the sentence twice.
    return text[:-1] if text.endswith("..") else text


def _choose(question: str, n: int) -> int:
    """Deterministic answer-template index for a question: a hash of its text, no random state."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n


def _also(currency: str | None, language: str | None) -> str:
    """The capital answers' tail: the country's currency and official language, where known."""
    parts = [f"its currency is {currency}"] if currency else []
    parts += [f"its official language is {language}"] if language else []
    return ", and " + " and ".join(parts) if parts else ""


def _ordinal(number: int) -> str:
    """16 -> '16th', 22 -> '22nd', 11 -> '11th'."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _period(number: int) -> str:
    return str(1 + sum(number > end for end in PERIOD_ENDS))


# Each fact: (topic, subject slug, fields for the templates). A question template that names a
# field the fact lacks is skipped for that fact (the Olympics' reverse questions: {rcity}).
def _facts() -> Iterator[tuple[str, str, dict[str, str]]]:
    for name, capital, currency, continent, language in COUNTRIES:
        # The continent is context in the answers (", a country in Europe"), never asked: an
        # answer must not state the fact of another group.
        base = {
            "c": name,
            "c_pos": _pos(name),
            "cont_mid": f", a country in {continent}," if continent else "",
            "cont_end": f", a country in {continent}" if continent else "",
            "cap_mid": f", whose capital is {capital}," if capital else "",
            "cap_end": f", whose capital is {capital}" if capital else "",
            "cur_end": f", and its currency is {currency}" if currency else "",
            "also": _also(currency, language),
        }
        slug = _slug(name.removeprefix("the "))
        if capital:
            yield "capital", slug, {**base, "cap": capital}
        if currency:
            yield "currency", slug, {**base, "cur": currency}
        if language:
            yield "official_language", slug, {**base, "lang": language}
    for number, symbol, name in ELEMENTS:
        yield "element_symbol", _slug(name), {"el": name, "sym": symbol, "n": str(number), "per": _period(number)}
    for number, symbol, name in ELEMENTS:
        yield (
            "atomic_number",
            _slug(name),
            {
                "el": name,
                "sym": symbol,
                "n": str(number),
                "per": _period(number),
                "protons": "proton" if number == 1 else "protons",
            },
        )
    for (number, _, name), (number2, _, name2) in zip(ELEMENTS, ELEMENTS[1:]):
        fields = {"el": name, "n": str(number), "el2": name2, "n2": str(number2)}
        yield "element_next", _slug(name), fields
    for i, planet in enumerate(PLANETS):
        yield "planet_order", _slug(planet), {"p": planet, "ord": ORDINALS[i], "num": NUMBER_WORDS[i]}
    for planet, pred, ans1, ans2 in PLANET_FEATURES:
        yield "planet_feature", _slug(f"{planet} {pred}"), {"pred": pred, "ans1": ans1, "ans2": ans2}
    for animal, young in ANIMAL_YOUNG:
        yield "animal_young", _slug(animal), {"a": animal, "a_art": _art(animal), "y_art": _art(young)}
    for plural, group in ANIMAL_GROUPS:
        yield "animal_group", _slug(plural), {"pl": plural, "g_art": _art(group)}
    for animal, verb, noun in ANIMAL_SOUNDS:
        yield "animal_sound", _slug(animal), {"a_art": _art(animal), "verb": verb, "noun_art": _art(noun)}
    for i, (title, author) in enumerate(BOOKS):
        # Another book of the same author in the table (the next one, cyclically), if any.
        same = [t for t, a in BOOKS[i + 1 :] + BOOKS[:i] if a == author]
        yield (
            "book_author",
            _slug(title),
            {
                "t": title,
                "au": author,
                "also": f", who also wrote {same[0]}" if same else "",
                "also_mid": f", who also wrote {same[0]}," if same else "",
            },
        )
    for invention, inventor in INVENTIONS:
        yield "inventor", _slug(invention.removeprefix("the ")), {"inv": invention, "who": inventor}
    twice = {name for _, name, _ in PRESIDENTS if sum(n == name for _, n, _ in PRESIDENTS) > 1}
    for number, name, year in PRESIDENTS:
        fields = {"n": str(number), "nth": _ordinal(number), "name": name, "year": str(year)}
        if name not in twice:
            fields["rname"] = name
        yield "president_order", str(number), fields
    for year, host, winner, host_asked in WORLD_CUPS:
        fields = {"y": str(year), "host": host, "winner": winner}
        if host in WORLD_CUP_REVERSE:
            fields["rhost"] = host
        if host_asked:
            yield "world_cup_host", str(year), fields
        yield "world_cup_winner", str(year), fields
    hosted: dict[tuple[str, str], int] = {}
    for _, season, city, _ in OLYMPICS:
        hosted[city, season] = hosted.get((city, season), 0) + 1
    for year, season, city, country in OLYMPICS:
        fields = {"y": str(year), "s": season, "city": city, "where": f"{city}, {country}" if country else city}
        if hosted[city, season] == 1 and (city, season) not in OLYMPICS_NO_REVERSE:
            fields["rcity"] = city
        yield "olympics", f"{year}-{season.lower()}", fields


def fact_id(topic: str, slug: str) -> str:
    """The group id of a fact: every row asking it shares it (ids are `<fact>-q<n>`)."""
    return f"{topic.replace('_', '-')}-{slug}"


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def generate() -> list[dict]:
    """All pairs, in a stable order: dicts with keys id, fact, question, answer, topic.

    Exact duplicate (question, answer) pairs are dropped (the first is kept)."""
    rows: list[dict] = []
    seen_pairs: set[tuple[str, str]] = set()
    seen_ids: set[str] = set()
    for topic, slug, raw in _facts():
        fields = _with_caps(raw)
        fact = fact_id(topic, slug)
        questions, answers = TEMPLATES[topic]
        for qi, qt in enumerate(questions, start=1):
            try:
                question = _finish(qt.format(**fields))
            except KeyError:  # a template this fact does not take (see _facts)
                continue
            answer = _finish(answers[_choose(question, len(answers))].format(**fields))
            if (question, answer) in seen_pairs:
                continue
            row_id = f"{fact}-q{qi}"
            if row_id in seen_ids:  # a table bug (two subjects with one slug), not user input
                raise ValueError(f"duplicate id {row_id!r} in the demo fact tables")
            seen_pairs.add((question, answer))
            seen_ids.add(row_id)
            rows.append({"id": row_id, "fact": fact, "question": question, "answer": answer, "topic": topic})
    return rows


def write_csv(path: str | Path) -> int:
    """Write the pairs to `path` (UTF-8, '\\n' line ends, minimal quoting), atomically.

    Returns the number of pairs written."""
    rows = generate()
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    from pipeline.core.paths import repo_path

    parser = argparse.ArgumentParser(
        prog="python -m tools.demo_data",
        description=(
            "Write the shipped demo dataset: a CSV of question -> answer sentence pairs "
            "(columns id,fact,question,answer,topic; `fact` is the group id of the fact a row "
            "states) generated deterministically from built-in tables of true facts (country "
            "capitals, currencies and official languages; chemical element symbols, atomic "
            "numbers and neighbours; planets; animal young, groups and sounds; book authors; inventors; "
            "Olympic host cities; US presidents by number; FIFA World Cup hosts and winners), "
            "each fact asked in several phrasings. No network access; "
            "the output is byte-identical on every run."
        ),
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"CSV file to write; a relative path is taken from the repository root "
        f"(default: {DEFAULT_OUT}). Parent directories are created; the file is replaced "
        f"atomically.",
    )
    args = parser.parse_args(argv)
    out = repo_path(args.out)
    n = write_csv(out)
    print(f"wrote {n} question-answer pairs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
